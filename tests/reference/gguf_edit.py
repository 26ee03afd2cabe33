"""gguf_edit.py — a small GGUF v3 reader/writer for tests, written from the format description
(magic, version, n_tensors, n_kv, key/value pairs, tensor infos, aligned data), so that tests can
take a file kiln wrote and change one metadata value or add entries the way a hostile file would.
Not used by kiln itself."""
import struct

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: '<B', I8: '<b', U16: '<H', I16: '<h', U32: '<I', I32: '<i', F32: '<f', BOOL: '<?', U64: '<Q', I64: '<q', F64: '<d'}


class Reader:
    def __init__(self, b):
        self.b, self.o = b, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.o)[0]
        self.o += struct.calcsize(fmt)
        return v

    def str(self):
        n = self.take('<Q')
        s = self.b[self.o:self.o + n]
        self.o += n
        return s.decode('utf-8', 'surrogateescape')

    def value(self, t):
        if t == STR:
            return self.str()
        if t == ARR:
            et, n = self.take('<I'), self.take('<Q')
            return (et, [self.value(et) for _ in range(n)])
        return self.take(_FMT[t])


def load(path):
    """Returns (kv: list of (key, type, value)), tensors: list of (name, ne, ggml_type, bytes))."""
    b = open(path, 'rb').read()
    r = Reader(b)
    assert b[:4] == b'GGUF'
    r.o = 4
    r.take('<I')
    nt, nkv = r.take('<Q'), r.take('<Q')
    kv = []
    for _ in range(nkv):
        k = r.str()
        t = r.take('<I')
        kv.append((k, t, r.value(t)))
    align = next((v for k, t, v in kv if k == 'general.alignment'), 32)
    infos = []
    for _ in range(nt):
        name = r.str()
        nd = r.take('<I')
        ne = [r.take('<Q') for _ in range(nd)]
        gt, off = r.take('<I'), r.take('<Q')
        infos.append((name, ne, gt, off))
    data0 = (r.o + align - 1) // align * align
    offs = sorted(o for _, _, _, o in infos) + [len(b) - data0]
    tensors = []
    for name, ne, gt, off in infos:
        end = min(x for x in offs if x > off)
        tensors.append((name, ne, gt, b[data0 + off:data0 + end]))
    return kv, tensors


def _put_str(out, s):
    e = s.encode('utf-8', 'surrogateescape')
    out += struct.pack('<Q', len(e)) + e


def _put_value(out, t, v):
    if t == STR:
        _put_str(out, v)
    elif t == ARR:
        et, items = v
        out += struct.pack('<IQ', et, len(items))
        for x in items:
            _put_value(out, et, x)
    else:
        out += struct.pack(_FMT[t], v)


def save(path, kv, tensors, align=32):
    out = bytearray(b'GGUF' + struct.pack('<IQQ', 3, len(tensors), len(kv)))
    for k, t, v in kv:
        _put_str(out, k)
        out += struct.pack('<I', t)
        _put_value(out, t, v)
    off = 0
    for name, ne, gt, data in tensors:
        _put_str(out, name)
        out += struct.pack('<I', len(ne)) + b''.join(struct.pack('<Q', x) for x in ne) + struct.pack('<IQ', gt, off)
        off += (len(data) + align - 1) // align * align
    out += b'\0' * ((-len(out)) % align)
    for _, _, _, data in tensors:
        out += data + b'\0' * ((-len(data)) % align)
    open(path, 'wb').write(out)


def set_kv(kv, key, t, v):
    """Replaces key's value (adds it when absent)."""
    for i, (k, _, _) in enumerate(kv):
        if k == key:
            kv[i] = (key, t, v)
            return kv
    kv.append((key, t, v))
    return kv
