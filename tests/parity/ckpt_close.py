"""Are two exported checkpoints equal within a relative tolerance, tensor by tensor?
usage: ckpt_close.py A.safetensors B.safetensors TOL
Prints the largest ||a - b|| / ||b|| over the tensors (parameters and BN buffers) and
exits 0 when it is <= TOL, 1 otherwise."""
import sys

import rnst

a, _ = rnst.load(sys.argv[1])
b, _ = rnst.load(sys.argv[2])
tol = float(sys.argv[3])
assert a.keys() == b.keys(), "different tensor sets"
worst, worst_name = 0.0, None
for name in a:
    x, y = a[name].double(), b[name].double()
    r = (x - y).norm().item() / max(y.norm().item(), 1e-30)
    if r > worst:
        worst, worst_name = r, name
print(f"max relative difference {worst:.3e} ({worst_name}), tolerance {tol:g}")
sys.exit(0 if worst <= tol else 1)
