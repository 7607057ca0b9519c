"""The suite's report: the table of members, with the peer's rate and the compile times, and
the table of arms against their bases (bench/suite.py prints both)."""

from __future__ import annotations

from bench.report import WARMUP_STEPS
from bench.suite_members import Member, lever


def overhead_seconds(line: dict, steps: int) -> float:
    """What a member cost beyond its compilation and its warm-up and timed steps: imports
    (the first member), the peak measurement, building the state, host transfers."""
    result = line["result"]
    stepping = (WARMUP_STEPS + steps) * result["seconds_per_step"] + result.get("profile_seconds", 0)
    return round(line["wall_seconds"] - result["compile_seconds"] - stepping, 2)


def attention_path(result: dict) -> str:
    """The attention path the member's train step took (bench.pretrain's `attention`)."""
    rate = result["config"]["attention_dropout_rate"]
    return f"{result['attention']}, dropout {rate:g}" if rate else result["attention"]


def ahead_cell(line: dict | None) -> str:
    """The table's "compiled ahead" cell: init + step compile seconds in a worker, with
    "(cache)" when the worker itself read both from the cache."""
    if line is None:
        return ""
    if "error" in line:
        return line["error"]
    r = line["result"]
    use = r["compilation_cache"]
    cached = bool(use) and use["requests"] > 0 and use["hits"] == use["requests"]
    return f"{r['init_compile_seconds'] + r['step_compile_seconds']:.1f}" + (" (cache)" if cached else "")


def table(members: list[Member], ours: dict, ahead: dict, peers: dict, steps: int) -> str:
    """The members' table: one row each, from their lines (ours, ahead) and the peer's."""
    rows = [
        "| member | batch x length | attention | tokens/s | MFU | compiled ahead s | compile s | overhead s "
        "| peer tokens/s | ours / peer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes: dict[str, None] = {}
    for member in members:
        line = ours[member.name]
        if "error" in line:
            rows.append(
                f"| {member.name} | | | {line['error']} | | {ahead_cell(ahead.get(member.name))} | | | | |"
            )
            continue
        r = line["result"]
        peer = peers.get(member.name, {})
        if "tokens_per_second" in peer:
            peer_rate = f"{peer['tokens_per_second']:.0f}"
        elif "note" in peer:  # the same for every row (no virtualenv): said once, under the table
            notes[peer["note"]] = None
            peer_rate = "n/a*"
        else:
            peer_rate = peer.get("error", "")
        ratio = (
            f"{r['tokens_per_second'] / peer['tokens_per_second']:.2f}x"
            if "tokens_per_second" in peer
            else ""
        )
        rows.append(
            f"| {member.name} | {r['batch']} x {r['seq']} | {attention_path(r)} "
            f"| {r['tokens_per_second']:.0f} | {r['mfu']:.1%} | {ahead_cell(ahead.get(member.name))} | "
            f"{r['compile_seconds']:.1f} | {overhead_seconds(line, steps):.1f} | {peer_rate} | {ratio} |"
        )
    return "\n".join(rows + [f"\n* {note}" for note in notes])


def arms_table(members: list[Member], ours: dict) -> str | None:
    """Each arm against its base, as a ratio of tokens/s; None when no arm ran with its base."""
    rows = [
        "| arm | lever | tokens/s | MFU | against | its tokens/s | arm / base |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in members:
        if arm.base is None or arm.base not in ours:
            continue
        line, base = ours[arm.name], ours[arm.base]
        if "result" not in line or "result" not in base:
            error = line.get("error") or f"{arm.base}: {base['error']}"
            rows.append(f"| {arm.name} | {lever(arm)} | {error} | | {arm.base} | | |")
            continue
        r, b = line["result"], base["result"]
        rows.append(
            f"| {arm.name} | {lever(arm)} | {r['tokens_per_second']:.0f} | {r['mfu']:.1%} | {arm.base} "
            f"| {b['tokens_per_second']:.0f} | {r['tokens_per_second'] / b['tokens_per_second']:.3f}x |"
        )
    return "\n".join(rows) if len(rows) > 2 else None
