# Run from the repository root: PYTHONPATH=src python benchmarks/hostcopy_ab.py [repeats] [out.json]
"""Old (torch index_copy_, two-pass) vs new (numpy rows, staged+overlap) host copier, one run."""
import importlib.util, statistics, subprocess, sys, time, json
import numpy as np, torch
from kvtier.worker import pagecopy as new
from kvtier.worker.blockmap import RowPlan, consecutive_runs
src = subprocess.run(["git", "show", "c996f9d:src/kvtier/worker/pagecopy.py"], capture_output=True, text=True, check=True).stdout
spec = importlib.util.spec_from_loader("oldpagecopy", loader=None); old = importlib.util.module_from_spec(spec); exec(src, old.__dict__)
out = []
for page in (8192, 16384, 65536, 262144):
  for blocks in (256, 4096):
    if blocks * page * 4 > (128 << 20): continue
    for ids in ("random", "contiguous"):
        layers = 2; P = page * 2 * layers
        g = torch.Generator().manual_seed(0)
        frags = [torch.randint(0, 256, (2 * blocks, page), dtype=torch.uint8, generator=g) for _ in range(2 * layers)]
        slab = torch.ones((2 * blocks, P), dtype=torch.uint8)
        gr = torch.randperm(2 * blocks, generator=g)[:blocks].numpy().astype(np.int64)
        cr = (torch.randperm(2 * blocks, generator=g)[:blocks].numpy() if ids == "random" else np.arange(blocks)).astype(np.int64)
        plan = RowPlan(gr, cr, consecutive_runs(cr))
        a, b = old.HostPageCopier(frags, slab), new.HostPageCopier(frags, slab)
        hs = torch.ones(blocks * P, dtype=torch.uint8); hd = torch.empty_like(hs)
        fns = {"plain": lambda: hd.copy_(hs), "old_g2c": lambda: a.copy(plan, True), "new_g2c": lambda: b.copy(plan, True),
               "old_c2g": lambda: a.copy(plan, False), "new_c2g": lambda: b.copy(plan, False)}
        for f in fns.values(): f()
        ts = {k: [] for k in fns}
        for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 7):
            for k, f in fns.items():
                s = time.perf_counter(); f(); ts[k].append(time.perf_counter() - s)
        med = {k: statistics.median(v) for k, v in ts.items()}
        row = {"page_bytes": page, "blocks": blocks, "ids": ids, "plain_gbps": round(blocks * P / med["plain"] / 1e9, 2),
               **{k: round(med["plain"] / v, 3) for k, v in med.items() if k != "plain"}}
        out.append(row); print(row, flush=True)
        b.close()
json.dump(out, open(sys.argv[2] if len(sys.argv) > 2 else "/tmp/dp/ab.json", "w"), indent=1)
