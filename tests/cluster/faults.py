"""What each fault did to the operations it hit: started, finished, retried, lost (the goal: 0 lost), and how long
the cluster took to recover."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Row:
    fault: str
    started: int = 0
    finished: int = 0
    retried: int = 0
    lost: int = 0
    recovery_s: float | None = None
    note: str = ""


@dataclass
class Ledger:
    rows: list[Row] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def row(self, fault: str) -> Row:
        r = Row(fault)
        self.rows.append(r)
        return r

    def table(self) -> str:
        head = f"{'fault':<44} {'started':>7} {'finished':>8} {'retried':>7} {'lost':>4} {'recovery s':>10}  note"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            rec = "-" if r.recovery_s is None else f"{r.recovery_s:.1f}"
            lines.append(
                f"{r.fault:<44} {r.started:>7} {r.finished:>8} {r.retried:>7} {r.lost:>4} {rec:>10}  {r.note}"
            )
        lines += [f"{k}: {v:.1f} s" for k, v in self.timings.items()]
        return "\n".join(lines)
