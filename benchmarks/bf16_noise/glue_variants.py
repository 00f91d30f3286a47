"""glue's step (benchmarks/step.py's program) with options: --backend cpu|reference --gelu glue|tanh
--perturb SEED --grads PATH --prec bf16|f32 --tag T"""
import sys, json, math, argparse, types
import os; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import numpy as np
ap = argparse.ArgumentParser()
ap.add_argument("--backend", default="cpu"); ap.add_argument("--gelu", default="glue")
ap.add_argument("--perturb", type=int, default=-1); ap.add_argument("--grads", default="")
ap.add_argument("--steps", type=int, default=10); ap.add_argument("--tag", default="g")
ap.add_argument("--prec", default="bf16"); ap.add_argument("--cfg", default="small")
a = ap.parse_args()
import glue, glue.nn as gnn, glue.numpy as gnp
from benchmarks import step as S

def gelu_tanh(x, approximate=True):  # jax.nn.gelu's form in x's dtype: x * (0.5 * (1 + tanh(u)))
    cdf = 0.5 * (1.0 + gnp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * (x ** 3))))
    return x * cdf
nn = types.SimpleNamespace(softmax=gnn.softmax, gelu=gelu_tanh if a.gelu == "tanh" else gnn.gelu)
cfg = S.CONFIGS[a.cfg]; bf16 = a.prec == "bf16"

def loss_fn(params, tokens, targets):
    return S.model_loss(gnp, nn, gnn.logsumexp, cfg, params, tokens, targets, bf16)
def step(params, m, v, tokens, targets, c1, c2):
    loss, grads = glue.value_and_grad(loss_fn)(params, tokens, targets)
    params, m, v = S.adamw(gnp, params, grads, m, v, c1, c2)
    return params, m, v, loss, grads
jitted = glue.jit(step, backend=a.backend)
params0, tokens, targets = S.init(cfg)
if a.perturb >= 0:
    rng = np.random.default_rng(a.perturb)
    params0 = [np.nextafter(p, np.where(rng.random(p.shape) < 0.5, -np.inf, np.inf).astype(np.float32)) for p in params0]
state = [list(params0), [np.zeros_like(p) for p in params0], [np.zeros_like(p) for p in params0]]
losses = []
for t in range(1, a.steps + 1):
    c1, c2 = S.corrections(t)
    *new, loss, grads = jitted(*state, tokens, targets, c1, c2)
    if t == 1 and a.grads:
        np.savez(a.grads, *[np.asarray(g).astype(np.float64) for g in grads])
    state[:] = [[np.asarray(x) for x in s] for s in new]
    losses.append(float(np.asarray(loss)))
json.dump(losses, open(os.path.join(os.environ.get("BF16_NOISE_OUT", "/tmp"), f"v_{a.tag}.json"), "w"))
print(a.tag, " ".join(f"{l:.6f}" for l in losses))
