"""Which arithmetic does the rotary_half kernel do on the GPU? (diagnostic)"""
import os, sys
import torch
import specter_kernels as sk
from specter_kernels import rotary_triton as rt

out_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
torch.manual_seed(0)
S = 5
q = torch.randn(1, S, 16, 128, device="cuda").half().transpose(1, 2)
angles = torch.rand(1, S, 64, device="cuda") * 100
emb = torch.cat((angles, angles), dim=-1)
cos, sin = emb.cos().half(), emb.sin().half()
out = sk.rotary_half(q, cos, sin)
ref = sk.rotary_half_reference(q, cos, sin)
half = 64
rot = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
c, s = cos.unsqueeze(1), sin.unsqueeze(1)
single = (q.float() * c.float() + rot.float() * s.float()).half()
prod_round = ((q.float() * c.float()).half().float() + (rot.float() * s.float()).half().float()).half()
fma1 = torch.addcmul((rot.float() * s.float()).half().float(), q.float(), c.float()).half()
fma2 = torch.addcmul((q.float() * c.float()).half().float(), rot.float(), s.float()).half()
for name, t in [("ref", ref), ("single", single), ("prod_round", prod_round), ("fma_a", fma1), ("fma_b", fma2)]:
    print(f"kernel vs {name}: {(out != t).sum().item()} of {out.numel()} differ; ref vs {name}: {(ref != t).sum().item()}")
idx = (out != ref).nonzero()[:5]
for i in idx.tolist():
    b, h, s_, d = i
    print(i, "q", q[b, h, s_, d].item(), "rot", rot[b, h, s_, d].item(), "cos", cos[b, s_, d].item(), "sin", sin[b, s_, d].item(), "out", out[b, h, s_, d].item(), "ref", ref[b, h, s_, d].item())
try:
    k = rt._rotary_half_kernel
    caches = getattr(k, "device_caches", None) or getattr(k, "cache", None)
    for dev_cache in (caches.values() if isinstance(caches, dict) else []):
        entries = dev_cache[0] if isinstance(dev_cache, tuple) else dev_cache
        for key, compiled in entries.items():
            with open(os.path.join(out_dir, "rotary_half.ptx"), "w") as f:
                f.write(compiled.asm.get("ptx", ""))
            with open(os.path.join(out_dir, "rotary_half.ttgir"), "w") as f:
                f.write(compiled.asm.get("ttgir", ""))
            print("wrote ptx/ttgir")
            break
except Exception as e:  # noqa: BLE001
    print("no asm:", e)
