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
#include <fstream>
#include <optional>
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

// ---- the archive's central directory, read before any record ----------------------------------
// torch.save stores every record uncompressed ("stored", method 0). A compressed record is not
// one it wrote, and LibTorch's reader inflates a record whole into memory: a 4.5 GB pickle
// deflated into a 5 MB file (a zip bomb) took the process past 4 GB. Each entry's method, sizes
// and offset are checked against the file before anything is read.

uint64_t le(const std::string& b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<size_t>(i)]);
  return v;
}

std::string read_at(std::ifstream& in, uint64_t offset, uint64_t bytes) {
  std::string b(static_cast<size_t>(bytes), '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(b.data(), static_cast<std::streamsize>(bytes));
  if (static_cast<uint64_t>(in.gcount()) != bytes) b.clear();
  return b;
}

struct CentralDirectory {
  uint64_t offset = 0, bytes = 0, entries = 0;
};

// The central directory's place, from the end-of-central-directory record (and its zip64 form);
// nullopt when there is none (LibTorch's reader then says what is wrong).
std::optional<CentralDirectory> find_central_directory(std::ifstream& in, uint64_t file_bytes) {
  const uint64_t tail_bytes = std::min<uint64_t>(file_bytes, 22 + 65535);
  const std::string tail = read_at(in, file_bytes - tail_bytes, tail_bytes);
  if (tail.size() < 22) return std::nullopt;
  size_t eocd = std::string::npos;
  for (size_t i = tail.size() - 22 + 1; i-- > 0;) {
    if (le(tail, i, 4) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd == std::string::npos) return std::nullopt;
  CentralDirectory cd{le(tail, eocd + 16, 4), le(tail, eocd + 12, 4), le(tail, eocd + 10, 2)};
  if ((cd.offset == 0xFFFFFFFF || cd.entries == 0xFFFF) && eocd >= 20 && le(tail, eocd - 20, 4) == 0x07064b50) {
    const uint64_t at = le(tail, eocd - 20 + 8, 8);
    if (at > file_bytes - 56) return std::nullopt;
    const std::string z = read_at(in, at, 56);
    if (z.size() != 56 || le(z, 0, 4) != 0x06064b50) return std::nullopt;
    cd = {le(z, 48, 8), le(z, 40, 8), le(z, 32, 8)};
  }
  return cd;
}

void check_zip_records(const std::string& path, const std::string& file, uint64_t file_bytes) {
  std::ifstream in(path, std::ios::binary);
  const std::optional<CentralDirectory> cd = in ? find_central_directory(in, file_bytes) : std::nullopt;
  if (!cd) return;
  const std::string damaged = file + " is damaged or was not written by torch.save: ";
  if (cd->offset > file_bytes || cd->bytes > file_bytes - cd->offset) throw InputError(damaged + "its zip directory lies past its end");
  const std::string dir = read_at(in, cd->offset, cd->bytes);
  size_t at = 0;
  for (uint64_t e = 0; e < cd->entries; ++e) {
    if (at + 46 > dir.size() || le(dir, at, 4) != 0x02014b50) throw InputError(damaged + "its zip directory is cut short");
    const size_t name_len = le(dir, at + 28, 2), extra_len = le(dir, at + 30, 2), comment_len = le(dir, at + 32, 2);
    if (at + 46 + name_len + extra_len + comment_len > dir.size()) throw InputError(damaged + "its zip directory is cut short");
    const std::string name = dir.substr(at + 46, name_len);
    uint64_t fields[3] = {le(dir, at + 24, 4), le(dir, at + 20, 4), le(dir, at + 42, 4)};  // uncompressed, compressed, offset
    // zip64: the fields that read 0xFFFFFFFF follow, 8 bytes each and in that order, in extra field 0x0001.
    for (size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const size_t id = le(dir, x, 2), len = le(dir, x + 2, 2);
      size_t v = x + 4;
      for (auto& f : fields) {
        if (id == 0x0001 && f == 0xFFFFFFFF && v + 8 <= x + 4 + len && v + 8 <= dir.size()) f = le(dir, v, 8), v += 8;
      }
      x += 4 + len;
    }
    const uint64_t method = le(dir, at + 10, 2);
    if (method != 0) {
      throw InputError(damaged + "record '" + cut_for_message(name, 60) + "' is compressed (zip method " + std::to_string(method) +
                       "); torch.save stores records uncompressed");
    }
    if (fields[0] != fields[1] || fields[2] > file_bytes || fields[1] > file_bytes - fields[2]) {
      throw InputError(damaged + "record '" + cut_for_message(name, 60) + "' claims " + std::to_string(fields[0]) +
                       " bytes that the file does not hold");
    }
    at += 46 + name_len + extra_len + comment_len;
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
  check_zip_records(path, file, static_cast<uint64_t>(size));
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
