// runtime/torch_save_reader.cpp — see torch_save_reader.h. The one place that talks to LibTorch's
// Unpickler and PyTorchStreamReader; the calls used here have the same shape in LibTorch 1.13 and
// 2.x (readArchiveAndTensors in torch/csrc/jit/serialization/import_read.cpp does the same, with a
// record reader that neither shares storages nor remembers record sizes).
#include "runtime/torch_save_reader.h"
#include "runtime/host_data.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/storage_context.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <unordered_map>
#include <vector>

#include "accumplan/errors.h"
#include "accumplan/units.h"

namespace accumplan {
namespace {

using RecordBytes = std::unordered_map<const void*, size_t>;  // a record's data address -> its bytes

// Every storage reachable from `v` must declare no more bytes than its record holds.
void check_declared_vs_present(const c10::IValue& v, const RecordBytes& present, const std::string& file, int depth = 0) {
  if (depth > 64) throw InputError(file + " nests lists deeper than 64 levels; expected a list of tensors");
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.has_storage()) return;
    const auto it = present.find(t.storage().data());
    if (it == present.end()) return;  // no record read for it: an empty storage
    const size_t declared = t.storage().nbytes();
    if (declared > it->second) {
      throw InputError(file + ": a tensor's storage declares " + std::to_string(declared) + " bytes but its record in the " +
                       "archive holds " + std::to_string(it->second) + "; the file is damaged or was not written by torch.save");
    }
    return;
  }
  if (v.isList()) {
    for (const auto& e : v.toListRef()) check_declared_vs_present(e, present, file, depth + 1);
  } else if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) check_declared_vs_present(e, present, file, depth + 1);
  }
}

c10::IValue unpickle(caffe2::serialize::PyTorchStreamReader& archive, RecordBytes& present) {
  at::DataPtr pickle;
  size_t pickle_bytes = 0;
  std::tie(pickle, pickle_bytes) = archive.getRecord("data.pkl");
  size_t read_bytes = 0;
  auto read = [&](char* buffer, size_t len) -> size_t {
    len = std::min(pickle_bytes - read_bytes, len);
    std::memcpy(buffer, static_cast<const char*>(pickle.get()) + read_bytes, len);
    read_bytes += len;
    return len;
  };
  auto read_record = [&](const std::string& key) {
    at::DataPtr data;
    size_t bytes = 0;
    std::tie(data, bytes) = archive.getRecord("data/" + key);
    present[data.get()] = bytes;
    return data;
  };
  // The storage context makes the unpickler reuse a storage it has read (key -> storage).
  torch::jit::Unpickler unpickler(read, nullptr, nullptr, read_record, {}, false,
                                  torch::jit::Unpickler::defaultTypeParser,
                                  std::make_shared<torch::jit::DeserializationStorageContext>());
  unpickler.set_version(archive.version());
  return unpickler.parse_ivalue();
}

}  // namespace

c10::IValue read_torch_save(const std::string& path, const std::string& file) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw InputError("cannot read the size of " + file + ": " + ec.message());
  check_host_data_bytes(static_cast<int64_t>(size), file, "give a smaller file");
  RecordBytes present;
  c10::IValue value;
  try {
    caffe2::serialize::PyTorchStreamReader archive(path);
    value = unpickle(archive, present);
  } catch (const std::bad_alloc&) {
    throw InputError(file + " declares records larger than this machine can allocate; the file is damaged or was not "
                     "written by torch.save");
  } catch (const std::exception& e) {
    if (const auto bytes = failed_host_allocation_bytes(e.what())) throw host_out_of_memory(*bytes, "reading " + file);
    std::string msg = e.what();
    msg = msg.substr(0, msg.find('\n'));
    throw InputError(file + " is not a file written by torch.save (" + msg +
                     "). Save with torch.save in its default (zip) format");
  }
  check_declared_vs_present(value, present, file);
  return value;
}

}  // namespace accumplan
