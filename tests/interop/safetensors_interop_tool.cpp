// Converts between safetensors and torch.save files with Volt, for test_safetensors_interop.py,
// which checks the results against Python's safetensors package. Tensors travel through
// torch.save archives because Volt reads and writes those exactly (test_checkpoint_interop.py).
//
//   safetensors_interop_tool to-safetensors <in.pt> <out.safetensors>
//       <in.pt> holds {"tensors": {name: tensor}, "metadata": {key: string}}; writes them with
//       volt::save_safetensors.
//   safetensors_interop_tool to-folder <in.pt> <dir> <max_shard_bytes>
//       The same, as a Hugging Face folder (volt::save_safetensors_folder with <in.pt>'s metadata).
//   safetensors_interop_tool to-torch <file or folder> <out.pt>
//       Reads every tensor with volt::load_safetensors and saves {"tensors": {...}, "metadata":
//       {...}} (a file's metadata; a folder's is empty).
//   safetensors_interop_tool slice <file> <name> <begin> <end> <out.pt>
//       Saves rows [begin, end) of tensor <name> (SafetensorsFile::slice) as {"tensors": {<name>: rows}}.
//
// Exits 2 with the message on stderr when Volt rejects its input (volt::Error).
#include <torch/torch.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/safetensors.h"
#include "volt/core/error.h"

namespace {

c10::impl::GenericDict string_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

struct Input {
  volt::NamedTensors tensors;
  volt::SafetensorsMetadata metadata;
};

Input read_input(const std::string& path) {
  const c10::impl::GenericDict root = volt::load_checkpoint_file(path).toGenericDict();
  Input input;
  for (const auto& item : root.at("tensors").toGenericDict()) {
    input.tensors.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  for (const auto& item : root.at("metadata").toGenericDict()) {
    input.metadata.emplace(item.key().toStringRef(), item.value().toStringRef());
  }
  return input;
}

void write_output(const volt::NamedTensors& tensors, const volt::SafetensorsMetadata& metadata,
                  const std::string& path) {
  auto tensor_dict = string_dict();
  for (const auto& [name, tensor] : tensors) tensor_dict.insert(name, tensor);
  auto metadata_dict = string_dict();
  for (const auto& [key, value] : metadata) metadata_dict.insert(key, value);
  auto root = string_dict();
  root.insert("tensors", tensor_dict);
  root.insert("metadata", metadata_dict);
  volt::save_checkpoint_file(root, path);
}

int run(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "to-safetensors" && argc == 4) {
    const Input input = read_input(argv[2]);
    volt::save_safetensors(argv[3], input.tensors, input.metadata);
    return 0;
  }
  if (command == "to-folder" && argc == 5) {
    const Input input = read_input(argv[2]);
    for (const std::string& file :
         volt::save_safetensors_folder(argv[3], input.tensors, std::stoll(argv[4]), input.metadata)) {
      std::cout << file << "\n";
    }
    return 0;
  }
  if (command == "to-torch" && argc == 4) {
    const bool folder = std::filesystem::is_directory(argv[2]);
    const volt::SafetensorsMetadata metadata =
        folder ? volt::SafetensorsMetadata{} : volt::SafetensorsFile::open(argv[2]).metadata();
    write_output(volt::load_safetensors(argv[2]), metadata, argv[3]);
    return 0;
  }
  if (command == "slice" && argc == 7) {
    const volt::SafetensorsFile file = volt::SafetensorsFile::open(argv[2]);
    write_output({{argv[3], file.slice(argv[3], std::stoll(argv[4]), std::stoll(argv[5]))}}, {}, argv[6]);
    return 0;
  }
  std::cerr << "usage: safetensors_interop_tool to-safetensors IN.pt OUT | to-folder IN.pt DIR MAX_SHARD_BYTES | "
               "to-torch SRC OUT.pt | slice FILE NAME BEGIN END OUT.pt\n";
  return 64;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const volt::Error& error) {
    std::cerr << error.what() << "\n";
    return 2;
  }
}
