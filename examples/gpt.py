"""A small GPT (decoder-only transformer) trained with a hand-written AdamW.

In the style of the single-file JAX GPT training scripts (nanoGPT and minGPT ports): the params
are a pytree of plain arrays from `jax.random`; the model is written out (token and position
embeddings, pre-layernorm blocks of causal multi-head attention and a GELU MLP, an output
projection tied to the token embedding); the blocks' params are stacked along a layer axis
(initialised by `jax.vmap` over the layers' keys) and run by `lax.scan`, as large JAX models do
to compile one layer; the optimizer is AdamW with bias correction, global-norm gradient clipping
and decoupled weight decay on the weights only (picked by key path), over the pytree with
`jax.tree_util`. The data are synthetic token sequences with a rule to learn, so the loss falls
within a few steps. Only the imports name glue; `examples/check_against_jax.py` runs the same
source under JAX.

    python -m examples.gpt
"""
import functools

import glue as jax
import glue.numpy as jnp
from glue import random

CONFIG = dict(vocab_size=32, block_size=16, n_layer=2, n_head=2, n_embd=32)


def init_params(key, vocab_size, block_size, n_layer, n_head, n_embd):
    def dense(key, fan_in, fan_out, scale=0.02):
        return {"w": scale * random.normal(key, (fan_in, fan_out)), "b": jnp.zeros((fan_out,))}

    def layernorm(size):
        return {"g": jnp.ones((size,)), "b": jnp.zeros((size,))}

    # GPT-2 scales the projections that write into the residual stream by 1/sqrt(2 * n_layer).
    proj_scale = 0.02 / jnp.sqrt(2.0 * n_layer)

    def init_block(key):
        k_qkv, k_attn_proj, k_fc, k_mlp_proj = random.split(key, 4)
        return {
            "ln_1": layernorm(n_embd),
            "attn": dense(k_qkv, n_embd, 3 * n_embd),
            "attn_proj": dense(k_attn_proj, n_embd, n_embd, proj_scale),
            "ln_2": layernorm(n_embd),
            "fc": dense(k_fc, n_embd, 4 * n_embd),
            "mlp_proj": dense(k_mlp_proj, 4 * n_embd, n_embd, proj_scale),
        }

    key, k_tok, k_pos = random.split(key, 3)
    return {
        "wte": 0.02 * random.normal(k_tok, (vocab_size, n_embd)),
        "wpe": 0.01 * random.normal(k_pos, (block_size, n_embd)),
        "ln_f": layernorm(n_embd),
        # Every block's params stacked along a leading layer axis, for lax.scan.
        "blocks": jax.vmap(init_block)(random.split(key, n_layer)),
    }


def layer_norm(p, x, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["g"] + p["b"]


def linear(p, x):
    return x @ p["w"] + p["b"]


def causal_self_attention(block, x, n_head):
    B, T, C = x.shape
    q, k, v = jnp.split(linear(block["attn"], x), 3, axis=-1)
    # (B, T, C) -> (B, n_head, T, head_dim)
    q, k, v = (t.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3) for t in (q, k, v))
    att = (q @ k.swapaxes(-1, -2)) / jnp.sqrt(k.shape[-1])
    mask = jnp.tril(jnp.ones((T, T), dtype=bool))
    att = jnp.where(mask, att, -1e9)
    att = jax.nn.softmax(att, axis=-1)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    return linear(block["attn_proj"], y)


def mlp(block, x):
    return linear(block["mlp_proj"], jax.nn.gelu(linear(block["fc"], x)))


def transformer_block(x, block, n_head):
    x = x + causal_self_attention(block, layer_norm(block["ln_1"], x), n_head)
    return x + mlp(block, layer_norm(block["ln_2"], x))


def gpt(params, idx, n_head):
    B, T = idx.shape
    x = params["wte"][idx] + params["wpe"][jnp.arange(T)]
    x, _ = jax.lax.scan(lambda x, block: (transformer_block(x, block, n_head), None), x, params["blocks"])
    x = layer_norm(params["ln_f"], x)
    return x @ params["wte"].T  # the output projection shares the token embedding


def loss_fn(params, inputs, targets, n_head):
    logits = gpt(params, inputs, n_head)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(nll)


def adamw_init(params):
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    return {"step": jnp.zeros((), jnp.int32), "mu": zeros, "nu": zeros}


def adamw_update(grads, state, params, lr, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, max_norm=1.0):
    # Clip by the global norm of all gradients, as GPT training scripts do.
    leaves = jax.tree_util.tree_leaves(grads)
    global_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in leaves))
    clip = jnp.minimum(1.0, max_norm / (global_norm + 1e-6))
    grads = jax.tree_util.tree_map(lambda g: g * clip, grads)

    step = state["step"] + 1
    mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["mu"], grads)
    nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state["nu"], grads)
    mu_hat_scale = 1 / (1 - b1 ** step)
    nu_hat_scale = 1 / (1 - b2 ** step)

    # Weight decay on the weight matrices and embeddings, as nanoGPT does; not on biases or gains.
    decayed = jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key in ("w", "wte", "wpe"), params)

    def update(p, m, v, decay):
        step_size = m * mu_hat_scale / (jnp.sqrt(v * nu_hat_scale) + eps)
        return p - lr * (step_size + (weight_decay * p if decay else 0.0))

    params = jax.tree_util.tree_map(update, params, mu, nu, decayed)
    return params, {"step": step, "mu": mu, "nu": nu}


def get_batch(key, batch_size, block_size, vocab_size):
    """Sequences that count up by a random stride modulo the vocabulary: the next token follows
    from the two before it, which attention has to look back for."""
    k_start, k_stride = random.split(key)
    start = random.randint(k_start, (batch_size, 1), 0, vocab_size)
    stride = random.randint(k_stride, (batch_size, 1), 1, 4)
    seq = (start + stride * jnp.arange(block_size + 1)) % vocab_size
    return seq[:, :-1], seq[:, 1:]


BATCH_SIZE = 8
LEARNING_RATE = 3e-3


@functools.partial(jax.jit, static_argnums=(4,))
def train_step(params, opt_state, inputs, targets, n_head):
    loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets, n_head)
    params, opt_state = adamw_update(grads, opt_state, params, LEARNING_RATE)
    return params, opt_state, loss


def main(steps=20, seed=0):
    key = random.PRNGKey(seed)
    key, init_key = random.split(key)
    params = init_params(init_key, **CONFIG)
    opt_state = adamw_init(params)
    print(f"number of parameters: {sum(p.size for p in jax.tree_util.tree_leaves(params)) / 1e3:.1f}K")
    losses = []
    for _ in range(steps):
        key, batch_key = random.split(key)
        inputs, targets = get_batch(batch_key, BATCH_SIZE, CONFIG["block_size"], CONFIG["vocab_size"])
        params, opt_state, loss = train_step(params, opt_state, inputs, targets, CONFIG["n_head"])
        losses.append(float(loss))
    return losses


if __name__ == "__main__":
    for step, loss in enumerate(main()):
        print(f"step {step:3d}  loss {loss:.5f}")
