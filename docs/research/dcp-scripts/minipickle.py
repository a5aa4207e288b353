"""A fixed-protocol (2) pickle writer of the kind a C++ program can carry in ~100 lines: no memo,
GLOBAL by text, NEWOBJ+BUILD for dataclasses. Emits only these opcodes:
PROTO GLOBAL EMPTY_TUPLE NEWOBJ EMPTY_DICT MARK SETITEMS BUILD BINUNICODE BININT LONG1 TUPLE
TUPLE1 REDUCE EMPTY_LIST APPENDS NONE NEWTRUE NEWFALSE STOP."""
import struct


class W:
    def __init__(self):
        self.b = bytearray(b"\x80\x02")                        # PROTO 2

    def glob(self, module, name):
        self.b += b"c" + module.encode() + b"\n" + name.encode() + b"\n"   # GLOBAL

    def str(self, s):
        e = s.encode("utf-8"); self.b += b"X" + struct.pack("<I", len(e)) + e   # BINUNICODE

    def int(self, v):
        if -2**31 <= v < 2**31:
            self.b += b"J" + struct.pack("<i", v)              # BININT
        else:
            n = (v.bit_length() + 8) // 8
            self.b += b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)   # LONG1

    def none(self): self.b += b"N"
    def bool(self, v): self.b += b"\x88" if v else b"\x89"
    def mark(self): self.b += b"("
    def tuple(self): self.b += b"t"                           # MARK ... TUPLE
    def reduce(self): self.b += b"R"
    def newobj(self, module, name):                           # cls.__new__(cls)
        self.glob(module, name); self.b += b")\x81"
    def build(self): self.b += b"b"
    def stop(self): self.b += b"."; return bytes(self.b)

    # containers: items are callables that emit one value each
    def dict(self, items):
        self.b += b"}"
        if items:
            self.mark()
            for k, emit in items:
                self.str(k) if isinstance(k, str) else self.int(k); emit()
            self.b += b"u"                                    # SETITEMS
    def list(self, emits):
        self.b += b"]"
        if emits:
            self.mark(); [e() for e in emits]; self.b += b"e"   # APPENDS
    def tup(self, emits):
        self.mark(); [e() for e in emits]; self.tuple()


MD = "torch.distributed.checkpoint.metadata"
DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64", "I64": "int64"}


def size(w, dims):                      # torch.Size((d0, d1, ...))
    w.glob("torch", "Size"); w.mark(); w.tup([(lambda d=d: w.int(d)) for d in dims]); w.tuple(); w.reduce()


def dataclass(w, name, fields, module=MD):   # cls.__new__(cls); obj.__dict__.update(fields)
    w.newobj(module, name); w.dict(fields); w.build()


def metadata_pickle(tensors, storage, planner_data):
    """tensors: {fqn: (dtype_str, full_shape, [(offsets, sizes), ...])};
    storage: {(fqn, tuple(offsets)): (relative_path, offset, length)};
    planner_data: {fqn: tuple path} or None."""
    w = W()

    def props(dt):
        w.newobj(MD, "TensorProperties")
        # __setstate__ takes (dtype, layout, requires_grad, memory-format enum, pin_memory)
        w.mark()
        w.glob("torch", DTYPES[dt]); w.glob("torch", "strided"); w.bool(False)
        w.glob(MD, "_MEM_FORMAT_ENCODING"); w.mark(); w.int(0); w.tuple(); w.reduce()
        w.bool(False)
        w.tuple(); w.build()

    def tsm(dt, shape, chunks):
        dataclass(w, "TensorStorageMetadata", [
            ("properties", lambda: props(dt)),
            ("size", lambda: size(w, shape)),
            ("chunks", lambda: w.list([(lambda o=o, s=s: dataclass(w, "ChunkStorageMetadata", [
                ("offsets", lambda: size(w, o)), ("sizes", lambda: size(w, s))])) for o, s in chunks]))])

    def mdi(fqn, off):
        dataclass(w, "MetadataIndex", [("fqn", lambda: w.str(fqn)), ("offset", lambda: size(w, off)),
                                       ("index", w.none)])

    def sinfo(path, off, length):
        dataclass(w, "_StorageInfo", [("relative_path", lambda: w.str(path)), ("offset", lambda: w.int(off)),
                                      ("length", lambda: w.int(length))],
                  module="torch.distributed.checkpoint.filesystem")

    def pdata():
        if planner_data is None:
            return w.none()
        w.dict([(k, (lambda p=p: w.tup([(lambda x=x: w.str(x) if isinstance(x, str) else w.int(x)) for x in p])))
                for k, p in planner_data.items()])

    sd_items = [(fqn, (lambda v=v: tsm(*v))) for fqn, v in tensors.items()]

    def storage_dict():             # keys are objects: SETITEMS takes key, value pairs
        w.b += b"}"; w.mark()
        for (fqn, off), (p, o, n) in storage.items():
            mdi(fqn, off); sinfo(p, o, n)
        w.b += b"u"

    dataclass(w, "Metadata", [("state_dict_metadata", lambda: w.dict(sd_items)), ("planner_data", pdata),
                              ("storage_data", storage_dict), ("storage_meta", w.none),
                              ("version", lambda: w.str("1.0.0"))])
    return w.stop()
