"""What a C++ reader of a PyTorch-written DCP checkpoint does, in Python without torch.distributed:
(1) a small pickle VM (the opcodes protocol 2-4 pickles of Metadata use) that turns the globals into
plain records instead of importing classes, (2) per tensor: allocate the full tensor, and for every
chunk read bytes [offset, offset+length) of storage_data's file, which are one complete torch.save
zip archive (torch.load stands in for Volt's load_from_bytes here), and copy it into the box.
usage: exp7_read_dcp_minimal.py CKPT_DIR REFERENCE.pt"""
import io, os, struct, sys
import torch
from common import compare


class Obj(dict):                       # an instance of a DCP dataclass: its class name + fields
    def __init__(self, cls): super().__init__(); self.cls = cls


def unpickle(b):
    st, memo, marks, i = [], {}, [], 0
    def pop_mark():
        m = marks.pop(); items = st[m:]; del st[m:]; return items
    def glob(mod, name):
        return ("G", mod, name)
    while True:
        op = b[i]; i += 1
        if op == 0x80: i += 1                                      # PROTO
        elif op == 0x95: i += 8                                    # FRAME
        elif op == 0x93: name = st.pop(); mod = st.pop(); st.append(glob(mod, name))  # STACK_GLOBAL
        elif op == ord("c"):                                       # GLOBAL
            j = b.index(b"\n", i); k = b.index(b"\n", j + 1)
            st.append(glob(b[i:j].decode(), b[j + 1:k].decode())); i = k + 1
        elif op == 0x94: memo[len(memo)] = st[-1]                  # MEMOIZE
        elif op == ord("q"): memo[b[i]] = st[-1]; i += 1           # BINPUT
        elif op == ord("r"): memo[struct.unpack_from("<I", b, i)[0]] = st[-1]; i += 4
        elif op == ord("h"): st.append(memo[b[i]]); i += 1         # BINGET
        elif op == ord("j"): st.append(memo[struct.unpack_from("<I", b, i)[0]]); i += 4
        elif op == ord("("): marks.append(len(st))                 # MARK
        elif op == ord(")"): st.append(())                         # EMPTY_TUPLE
        elif op == 0x85: st[-1:] = [tuple(st[-1:])]                # TUPLE1
        elif op == 0x86: st[-2:] = [tuple(st[-2:])]                # TUPLE2
        elif op == 0x87: st[-3:] = [tuple(st[-3:])]                # TUPLE3
        elif op == ord("t"): st.append(tuple(pop_mark()))          # TUPLE
        elif op == ord("}"): st.append({})                         # EMPTY_DICT
        elif op == ord("]"): st.append([])                         # EMPTY_LIST
        elif op == ord("u"):                                       # SETITEMS
            items = pop_mark(); d = st[-1]
            for k in range(0, len(items), 2):
                key = items[k]
                if isinstance(key, Obj): key = (key["fqn"], tuple(key["offset"]) if key.get("offset") is not None else None)
                d[key] = items[k + 1]
        elif op == ord("s"): v = st.pop(); k = st.pop(); st[-1][k] = v   # SETITEM
        elif op == ord("a"): v = st.pop(); st[-1].append(v)       # APPEND
        elif op == ord("e"): items = pop_mark(); st[-1].extend(items)    # APPENDS
        elif op == 0x81: st.pop(); cls = st.pop(); st.append(Obj(cls[2]))  # NEWOBJ (args ignored: always ())
        elif op == ord("b"):                                       # BUILD
            state = st.pop(); o = st[-1]
            if isinstance(state, dict): o.update(state)
            else: o["dtype"] = state[0][2]                          # TensorProperties.__setstate__ tuple
        elif op == ord("R"):                                       # REDUCE
            args = st.pop(); f = st.pop(); g = f[1] + "." + f[2]
            if g == "torch.Size": st.append(list(args[0]))
            elif g == "torch.serialization._get_layout": st.append(args[0])
            elif g in ("builtins.getattr",): st.append(args[1])    # enum member by name
            elif g.endswith("_MEM_FORMAT_ENCODING"): st.append(args[0])
            elif g in ("pathlib.PosixPath", "pathlib.WindowsPath"): st.append("/".join(args))
            else: raise ValueError("refused global " + g)
        elif op == 0x8c: n = b[i]; st.append(b[i + 1:i + 1 + n].decode()); i += 1 + n   # SHORT_BINUNICODE
        elif op == ord("X"): n = struct.unpack_from("<I", b, i)[0]; st.append(b[i + 4:i + 4 + n].decode()); i += 4 + n
        elif op == ord("J"): st.append(struct.unpack_from("<i", b, i)[0]); i += 4
        elif op == ord("K"): st.append(b[i]); i += 1
        elif op == ord("M"): st.append(struct.unpack_from("<H", b, i)[0]); i += 2
        elif op == 0x8a: n = b[i]; st.append(int.from_bytes(b[i + 1:i + 1 + n], "little", signed=True)); i += 1 + n
        elif op == ord("N"): st.append(None)
        elif op == 0x88: st.append(True)
        elif op == 0x89: st.append(False)
        elif op == ord("G"): st.append(struct.unpack_from(">d", b, i)[0]); i += 8
        elif op == ord("."): return st.pop()
        else: raise ValueError(f"unsupported opcode {op:#x} at {i - 1}")


d, refp = sys.argv[1], sys.argv[2]
md = unpickle(open(os.path.join(d, ".metadata"), "rb").read())
sdm, storage = md["state_dict_metadata"], md["storage_data"]
out, ok = {}, True
for fqn, tm in sdm.items():
    if tm.cls == "BytesStorageMetadata":
        si = storage[(fqn, None)]
        with open(os.path.join(d, si["relative_path"]), "rb") as f:
            f.seek(si["offset"]); out[fqn] = torch.load(io.BytesIO(f.read(si["length"])), weights_only=True)
        continue
    full = torch.empty(tm["size"], dtype=getattr(torch, tm["properties"]["dtype"]))
    for c in tm["chunks"]:
        si = storage[(fqn, tuple(c["offsets"]))]
        with open(os.path.join(d, si["relative_path"]), "rb") as f:
            f.seek(si["offset"]); data = f.read(si["length"])
        t = torch.load(io.BytesIO(data), weights_only=True)   # = one torch.save archive
        assert list(t.shape) == list(c["sizes"])
        full[tuple(slice(o, o + s) for o, s in zip(c["offsets"], c["sizes"]))] = t
    out[fqn] = full
print("non-tensor items:", {k: v for k, v in out.items() if not torch.is_tensor(v)})
ref = torch.load(refp, weights_only=False)
for k, v in ref["model"].items():
    ok &= compare(f"model.{k}", out[f"model.{k}"], v)
for k, v in ref["optim"].items():
    ok &= compare(f"optim.state.{k}", out[f"optim.state.{k}"], v)
print("ALL OK" if ok else "SOME MISMATCH")
