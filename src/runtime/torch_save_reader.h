// runtime/torch_save_reader.h — reads a file Python's torch.save wrote (the zip format) into an
// IValue, treating every byte of it as a claim to check.
// What it is: LibTorch's unpickler driven with our own record reader, so that
//   - every storage's declared size (numel × item size in the pickle) is checked against the bytes
//     its record really holds in the archive (a storage declaring 2^40 elements over a 40-byte
//     record would otherwise be read past its end, or crash);
//   - a storage shared by many tensors (views: t[0], t[1], ... of one tensor) is read once, not once
//     per view (10^5 views of one storage would otherwise drive the process to 15.6 GB);
//   - the file's size is held to the host-data limit (host_data.h) before anything is read.
// What it is not: a check of what the tensors address inside their storages (batch.cpp's
// check_storage does that), nor of their shapes or values (the data check in batch.h).
#pragma once

#include <ATen/core/ivalue.h>

#include <string>

namespace accumplan {

// The object in `path`; InputError naming `file` (how messages name it: "--data 'x.pt'") and
// saying why for anything that is not a well-formed torch.save zip archive.
c10::IValue read_torch_save(const std::string& path, const std::string& file);

}  // namespace accumplan
