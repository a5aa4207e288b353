"""Inspect a DCP checkpoint written by dcp.save: the .metadata pickle (globals, opcodes, structure)
and the .distcp items (each a complete torch.save zip archive at storage_data offset/length).
usage: exp4b_inspect.py CKPT_DIR"""
import io, os, sys, pickle, pickletools, zipfile, collections
import torch

d = sys.argv[1]
raw = open(os.path.join(d, ".metadata"), "rb").read()
print(".metadata: %d bytes, protocol byte %d" % (len(raw), raw[1]))
ops, globs, strs = collections.Counter(), set(), []
for op, arg, pos in pickletools.genops(raw):
    ops[op.name] += 1
    if op.name in ("SHORT_BINUNICODE", "BINUNICODE"):
        strs.append(arg)
print("opcodes:", dict(sorted(ops.items())))
class Recorder(pickle.Unpickler):
    def find_class(self, module, name):
        globs.add(f"{module}.{name}")
        return super().find_class(module, name)
md = Recorder(io.BytesIO(raw)).load()
print("globals:", sorted(globs))
print("Metadata fields:", list(vars(md)))
print("version:", md.version, "| planner_data sample:", list(md.planner_data.items())[:2])
print("storage_meta:", md.storage_meta)
for k, v in list(md.state_dict_metadata.items()):
    if hasattr(v, "chunks"):
        print(f"  {k}: size={list(v.size)} dtype={v.properties.dtype} chunks=" +
              str([(list(c.offsets), list(c.sizes)) for c in v.chunks]))
    else:
        print(f"  {k}: {type(v).__name__}")
print("storage_data (MetadataIndex -> _StorageInfo):")
for idx, si in list(md.storage_data.items())[:6]:
    print(f"  {idx} -> {si}")
print("  ...", len(md.storage_data), "items")
# every item: slice the file at offset/length; it is a whole torch.save zip archive
kinds = collections.Counter()
for idx, si in md.storage_data.items():
    with open(os.path.join(d, si.relative_path), "rb") as f:
        f.seek(si.offset); b = f.read(si.length)
    assert b[:4] == b"PK\x03\x04", b[:4]
    names = zipfile.ZipFile(io.BytesIO(b)).namelist()
    obj = torch.load(io.BytesIO(b), weights_only=True)
    kinds[type(obj).__name__] += 1
    if idx.fqn in ("model.fc1.weight", "optim.param_groups.0.lr", "optim.state.fc1.weight.step"):
        print(f"  item {idx.fqn}@{list(idx.offset) if idx.offset is not None else None}: zip entries {names}; torch.load -> "
              f"{type(obj).__name__} {tuple(obj.shape) if hasattr(obj, 'shape') else obj!r}")
print("item payload types:", dict(kinds))
zi = zipfile.ZipFile(io.BytesIO(b))
print("zip compression types:", {i.compress_type for i in zi.infolist()})
