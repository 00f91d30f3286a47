"""The step suite's bf16 program in jax with one legitimate choice changed at a time.
args: --wide f32|f64 --gelu jax|sigmoid --splitk N --perturb SEED --grads PATH --steps N --tag T
XLA_FLAGS=--xla_allow_excess_precision=false for strict per-op bf16 rounding."""
import sys, json, math, argparse, types, functools
import os; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import numpy as np
ap = argparse.ArgumentParser()
ap.add_argument("--wide", default="f32"); ap.add_argument("--gelu", default="jax")
ap.add_argument("--splitk", type=int, default=1); ap.add_argument("--perturb", type=int, default=-1)
ap.add_argument("--grads", default=""); ap.add_argument("--attn", default="program"); ap.add_argument("--biasf32", action="store_true"); ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--tag", default="x"); ap.add_argument("--prec", default="bf16"); ap.add_argument("--cfg", default="small")
a = ap.parse_args()
import jax
if a.wide == "f64":
    jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
from jax.scipy.special import logsumexp
from benchmarks import step as S

W = jnp.float64 if a.wide == "f64" else jnp.float32
class XP:  # jnp whose "float32" is the wide type
    def __getattr__(self, n):
        return W if n == "float32" else getattr(jnp, n)
xp = XP()

def gelu_sigmoid(x, approximate=True):  # glue.nn.gelu's 16-bit form: x * sigmoid(2u)
    cubic = x + 0.044715 * x ** 3
    if x.dtype == jnp.bfloat16:
        return x * jax.nn.sigmoid(math.sqrt(8 / math.pi) * cubic)
    return 0.5 * x * (1 + jnp.tanh(math.sqrt(2 / math.pi) * cubic))
nn = types.SimpleNamespace(softmax=jax.nn.softmax, gelu=gelu_sigmoid if a.gelu == "sigmoid" else jax.nn.gelu)

cfg = S.CONFIGS[a.cfg]
bf16 = a.prec == "bf16"

def mm(x, y):
    if a.splitk == 1 or x.dtype != jnp.bfloat16:
        return x @ y
    K = x.shape[-1]; c = K // a.splitk
    acc = None
    for i in range(a.splitk):
        part = jnp.matmul(x[..., i * c:(i + 1) * c], y[..., i * c:(i + 1) * c, :], preferred_element_type=jnp.float32)
        acc = part if acc is None else acc + part
    return acc.astype(x.dtype)

def model_loss(params, tokens, targets):
    # benchmarks/step.py model_loss with `@` through mm
    d, H = cfg.d, cfg.heads; Dh = d // H
    low = xp.bfloat16 if bf16 else xp.float32
    cast = (lambda x: x.astype(low)) if bf16 else (lambda x: x)
    def badd(y, b):  # y + cast(b); with --biasf32 the same forward, its bias gradient summed in f32
        if a.biasf32 and bf16:
            return (y.astype(xp.float32) + cast(b).astype(xp.float32)).astype(low)
        return y + cast(b)
    layer_norm = functools.partial(S.layer_norm_xp, xp, cast)
    wte, x, causal = S.embedded(xp, cast, cfg, params, tokens)
    for layer in range(cfg.layers):
        g1, b1, wqkv, bqkv, wo, bo, g2, b2, w1, bb1, w2, bb2 = S.layer_params(params, layer)
        h = layer_norm(x, g1, b1)
        qkv = badd(mm(h, cast(wqkv)), bqkv)
        qkv = qkv.reshape(cfg.B, cfg.T, 3, H, Dh).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if a.attn == "f32" and bf16:  # glue's attention primitive: f32 throughout, outputs rounded once
            q32, k32, v32 = (t.astype(xp.float32) for t in (q, k, v))
            s = (q32 @ k32.swapaxes(-1, -2)) * (1.0 / math.sqrt(Dh))
            s = xp.where(causal, s, -1e9)
            o = (nn.softmax(s, axis=-1) @ v32).astype(low).transpose(0, 2, 1, 3).reshape(cfg.B, cfg.T, d)
        else:
            s = mm(q, k.swapaxes(-1, -2)).astype(xp.float32) * (1.0 / math.sqrt(Dh))
            s = xp.where(causal, s, -1e9)
            p = cast(nn.softmax(s, axis=-1))
            o = mm(p, v).transpose(0, 2, 1, 3).reshape(cfg.B, cfg.T, d)
        x = badd(x + mm(o, cast(wo)), bo)
        h = layer_norm(x, g2, b2)
        x = badd(x + mm(nn.gelu(badd(mm(h, cast(w1)), bb1), approximate=True), cast(w2)), bb2)
    h = layer_norm(x, params[-2], params[-1])
    logits = mm(h, cast(wte).T).astype(xp.float32)
    picked = xp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return (logsumexp(logits, axis=-1) - picked).mean()

def step(params, m, v, tokens, targets, c1, c2):
    loss, grads = jax.value_and_grad(model_loss)(params, tokens, targets)
    params, m, v = S.adamw(xp, params, grads, m, v, c1, c2)
    return params, m, v, loss, grads

jitted = jax.jit(step)
params0, tokens, targets = S.init(cfg)
if a.perturb >= 0:  # one f32 ulp, either way, on every weight
    rng = np.random.default_rng(a.perturb)
    params0 = [np.nextafter(p, np.where(rng.random(p.shape) < 0.5, -np.inf, np.inf).astype(np.float32)) for p in params0]
np_w = np.float64 if a.wide == "f64" else np.float32
state = [[jnp.asarray(p.astype(np_w)) for p in params0], [jnp.zeros(p.shape, W) for p in params0], [jnp.zeros(p.shape, W) for p in params0]]
losses = []
for t in range(1, a.steps + 1):
    c1, c2 = S.corrections(t)
    if a.wide == "f64":
        c1, c2 = 1 / (1 - S.BETA1 ** t), 1 / (1 - S.BETA2 ** t)
    *new, loss, grads = jitted(*state, tokens, targets, c1, c2)
    if t == 1 and a.grads:
        np.savez(a.grads, *[np.asarray(g, np.float64) for g in grads])
    state[:] = new
    losses.append(float(loss))
json.dump(losses, open(os.path.join(os.environ.get("BF16_NOISE_OUT", "/tmp"), f"v_{a.tag}.json"), "w"))
print(a.tag, " ".join(f"{l:.6f}" for l in losses))
