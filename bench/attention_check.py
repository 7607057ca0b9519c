r"""The attention paths on this machine's platform: equal to the explicit softmax, and their cost.

    python -m bench.attention_check [--batch=32] [--seq=512] [--heads=16] [--head_dim=64] \
        [--dtype=bfloat16] [--paths=auto,xla,flash,flash+dropout,...] [--steps=20]

On rows with trailing padding and packed examples, each path's output and the gradients of
q, k and v are compared with the explicit softmax computed in float32 from the same inputs
(at real tokens; padding queries' outputs are never read); a path named with '+dropout'
(e.g. 'flash+dropout') drops with BERT's rate (0.1) and is compared with the explicit path
dropping with the same key (the same masks). Then each path's forward and backward is timed,
with 'explicit+dropout' (what BERT's recipes train with today) beside them.
'auto' is the path models/attention.py picks here. Prints one JSON line per path and exits
with status 1 if a path is off by more than the dtype's tolerance. What an accelerator run
calls first (docs/performance.md), so that a kernel's mistake shows before its speed.
"""

from __future__ import annotations

import json
import sys
import time

from core import cli

TOLERANCE = {"float32": 2e-5, "bfloat16": 2e-2, "float16": 5e-3}  # of the reference's largest value


def build_parser():
    parser = cli.parser(__doc__, "bench.attention_check")
    parser.add_argument("--batch", type=cli.positive_int, default=32)
    parser.add_argument("--seq", type=cli.positive_int, default=512)
    parser.add_argument("--heads", type=cli.positive_int, default=16)
    parser.add_argument("--head_dim", type=cli.positive_int, default=64)
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="bfloat16")
    parser.add_argument("--paths", default="auto", help="comma-separated attention paths to check")
    parser.add_argument("--steps", type=cli.positive_int, default=20, help="timed forward + backward passes")
    return parser


def _run(args) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from models import attention

    batch, seq = args.batch, args.seq
    rs = np.random.RandomState(0)
    q, k, v = (
        jnp.asarray(rs.normal(size=(batch, seq, args.heads, args.head_dim)), args.dtype) for _ in range(3)
    )
    # Even rows: one example, the last third padding; odd rows: two packed examples, 5 pads.
    input_mask = np.ones((batch, seq), np.int32)
    input_mask[0::2, seq - seq // 3 :] = 0
    input_mask[1::2, seq - 5 :] = 0
    example_ids = np.where(np.arange(seq) < seq // 2, 1, 2)[None] * input_mask
    example_ids[0::2] = input_mask[0::2]
    real = input_mask.astype(bool)
    weights = jnp.asarray(rs.normal(size=q.shape), jnp.float32) * input_mask[..., None, None]
    dropout_rng = jax.random.key(0)

    def path(name: str, packed: bool):
        """'explicit', 'flash', ... or with '+dropout' (BERT's 0.1, the same key on every path)."""
        mask = attention.KeyMask(jnp.asarray(input_mask), jnp.asarray(example_ids) if packed else None)
        implementation, _, dropout = name.partition("+")
        rate = 0.1 if dropout else 0.0
        return lambda q, k, v: attention.attend(
            implementation, q, k, v, mask, dropout_rate=rate, dropout_rng=dropout_rng if rate else None
        )

    def value_and_grads(fn):
        def loss(q, k, v):
            return (fn(q, k, v).astype(jnp.float32) * weights).sum()

        return jax.jit(lambda q, k, v: (fn(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)))

    failed = False
    names = []
    for name in args.paths.split(","):
        if name == "auto":
            name, _ = attention.choose(
                "auto",
                platform=attention.platform(),
                dtype=args.dtype,
                head_dim=args.head_dim,
                length=seq,
                dropout=False,
            )
        names.append(name)
    for name in dict.fromkeys([*names, "explicit+dropout"]):
        line = {
            "path": name,
            "platform": attention.platform(),
            "shape": [batch, seq, args.heads, args.head_dim],
        }
        if name != "explicit+dropout":
            # The reference: the explicit path in float32, with the same dropout if any (the
            # flash kernel draws the explicit path's masks).
            reference = "explicit+dropout" if name.endswith("+dropout") else "explicit"
            for packed in (False, True):
                f32 = [x.astype(jnp.float32) for x in (q, k, v)]
                expected = value_and_grads(path(reference, packed))(*f32)
                actual = value_and_grads(path(name, packed))(q, k, v)
                errors = []
                for got, want in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
                    got, want = np.asarray(got, np.float32)[real], np.asarray(want, np.float32)[real]
                    errors.append(float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)))
                line["packed" if packed else "padded"] = {
                    "relative_error": dict(zip(["out", "dq", "dk", "dv"], errors))
                }
                failed |= max(errors) > TOLERANCE[args.dtype]
        step = value_and_grads(path(name, packed=False))
        jax.block_until_ready(step(q, k, v))
        start = time.perf_counter()
        for _ in range(args.steps):
            out = step(q, k, v)
        jax.block_until_ready(out)
        line["ms_forward_backward"] = round(1000 * (time.perf_counter() - start) / args.steps, 3)
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


main = cli.entry(build_parser, _run)

if __name__ == "__main__":
    sys.exit(main())
