import torch
from stitchcuda.verify.profiling import profile_calls
a = torch.randn(2048, 2048, device="cuda"); m = torch.nn.Linear(2048, 2048).cuda()
for _ in range(2): m(a).relu()
out = profile_calls({"ref": lambda: m(a).relu(), "cand": lambda: (a @ a)}, {"ref": m}, shapes=True)
for k, p in out.items():
    print(k, p.origin_share, [(x.name[:40], x.origin) for x in p.kernels], [(o.name, round(o.share, 2)) for o in p.ops], [m.name for m in p.modules])
