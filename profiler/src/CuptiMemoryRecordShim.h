// CuptiMemoryRecordShim.h — which CUPTI struct a CUPTI_ACTIVITY_KIND_MEMORY2 record is, for the
// CUPTI version being compiled against.
//
// What it is: the one place that knows the record's versioned name. CUPTI appends a number to a
// record struct whenever its layout changes, and the buffer holds records in the layout of the
// headers the program was built with, so the cast must match CUPTI_API_VERSION exactly.
// What it is not: a general CUPTI compatibility layer. Only fields common to both layouts are
// read (kind, memoryOperationType, memoryKind, address, bytes, timestamp, deviceId).
// Included only by CuptiActivityApi.cpp (vendor code stays in Cupti* files).
#pragma once

#include <cupti.h>

namespace accumplan::cupti_shim {

#if CUPTI_API_VERSION >= 24
// CUDA 12.6 and later (checked here: CUDA 13.0, CUPTI_API_VERSION 130001): the record gained
// the `source` field and is CUpti_ActivityMemory4.
using Memory2Record = CUpti_ActivityMemory4;
#else
// CUDA 11.6 to 12.5. Not compiled on the development machine; the fields read are the same.
using Memory2Record = CUpti_ActivityMemory3;
#endif

}  // namespace accumplan::cupti_shim
