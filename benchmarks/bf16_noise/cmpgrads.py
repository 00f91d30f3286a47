import sys, numpy as np
names = ["wte", "wpe"] + [f"L{l}.{n}" for l in range(4) for n in "g1 b1 wqkv bqkv wo bo g2 b2 w1 bb1 w2 bb2".split()] + ["gf", "bf"]
ref = np.load(sys.argv[1]); others = [(p.split("/")[-1][2:-4], np.load(p)) for p in sys.argv[2:]]
print(f"{'tensor':10s} {'|g| ref':>9s} " + " ".join(f"{n[:14]:>14s}" for n, _ in others))
worst = {n: 0 for n, _ in others}
for i, name in enumerate(names):
    r = ref[f"arr_{i}"]; nr = np.linalg.norm(r)
    errs = [np.linalg.norm(o[f"arr_{i}"] - r) / nr for _, o in others]
    print(f"{name:10s} {nr:9.3e} " + " ".join(f"{e:14.2e}" for e in errs))
