"""`python -m glue`: train a small MLP classifier with a jitted value_and_grad step.

Shows the traced IR of the loss, the fused kernels of the training step, the loss falling, and
checks one step on the chosen backend against the NumPy reference.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import glue
import glue.nn as nn
from glue.reference.compare import mismatch


def init_params(rng: np.random.Generator, sizes: list[int]) -> list[dict[str, np.ndarray]]:
    return [{"w": (rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32),
             "b": np.zeros(n, np.float32)} for m, n in zip(sizes[:-1], sizes[1:])]


def mlp(params, x):
    for layer in params[:-1]:
        x = nn.gelu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, labels):
    return nn.cross_entropy(mlp(params, x), labels)


def train_step(params, x, labels, lr):
    loss, grads = glue.value_and_grad(loss_fn)(params, x, labels)
    return glue.tree_map(lambda p, g: p - lr * g, params, grads), loss


def blobs(rng: np.random.Generator, n: int, features: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic classification task: Gaussian clusters around random centres."""
    centres = rng.standard_normal((classes, features)).astype(np.float32) * 2
    labels = rng.integers(0, classes, n).astype(np.int32)
    x = centres[labels] + rng.standard_normal((n, features)).astype(np.float32)
    return x, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default=None, help="cuda | cpu | reference (default: best available)")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    backend = args.backend or glue.default_backend_name()
    rng = np.random.default_rng(0)
    x, labels = blobs(rng, 256, 16, 4)
    params = init_params(rng, [16, 64, 64, 4])

    print(f"glue {glue.__version__}: backends available {glue.available_backends()}, using {backend!r}\n")
    print("The loss, as traced (glue.make_ir):")
    print(glue.make_ir(loss_fn)(params, x, labels))

    step = glue.jit(train_step, backend=backend)
    t0 = time.perf_counter()
    compiled = step.lower(params, x, labels, np.float32(0.1)).compile()
    print(f"\nThe training step compiled in {time.perf_counter() - t0:.2f} s into "
          f"{len(compiled.kernels)} kernels:")
    for kernel in compiled.kernels:
        print(f"  {kernel.kind:12s} {kernel.name}")

    reference = glue.jit(train_step, backend="reference")
    _check_step(step, reference, params, x, labels)

    print("\nTraining (SGD, lr 0.1):")
    # The batch and the rate live where the backend computes, so a step uploads nothing; the
    # parameters each step returns are already there.
    batch, lr = [glue.device_put(v, backend) for v in (x, labels)], glue.device_put(np.float32(0.1), backend)
    t0 = time.perf_counter()
    for i in range(args.steps):
        params, loss = step(params, *batch, lr)
        if i % 10 == 0 or i == args.steps - 1:
            print(f"  step {i:3d}  loss {float(loss):.4f}")
    elapsed = time.perf_counter() - t0
    accuracy = float(np.mean(np.argmax(np.asarray(mlp(params, x)), axis=-1) == labels))
    print(f"\n{args.steps} steps in {elapsed:.3f} s ({elapsed / args.steps * 1e6:.0f} us/step); "
          f"training accuracy {accuracy:.1%}")


def _check_step(step, reference, params, x, labels) -> None:
    got = glue.tree_flatten(step(params, x, labels, np.float32(0.1)))[0]
    want = glue.tree_flatten(reference(params, x, labels, np.float32(0.1)))[0]
    problems = [p for g, w in zip(got, want)
                if (p := mismatch(np.asarray(g), np.asarray(w), glue.Array(np.asarray(w)).aval.dtype, scale=10))]
    status = "matches" if not problems else "DIFFERS from"
    print(f"\nOne step on this backend {status} the NumPy reference ({len(got)} outputs compared).")
    if problems:
        raise SystemExit("\n".join(problems))


if __name__ == "__main__":
    main()
