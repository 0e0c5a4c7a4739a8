"""Where a spare's GPU window goes: the reference preparation's steps, timed one by one (fresh process).

python bench/prep_probe.py [--n 16777216] [--variant pageable|pinned]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1 << 24)
    p.add_argument("--variant", default="pageable")
    p.add_argument("--trials", type=int, default=5)
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("prep_probe: no CUDA GPU here (torch.cuda.is_available() is False); it probes GPU steps only")
    dev = torch.device("cuda:0")
    torch.cuda.init()  # type: ignore[no-untyped-call]
    torch.empty(1, device=dev).zero_()
    torch.cuda.synchronize()
    model = torch.nn.ReLU()
    laps: dict[str, float] = {}
    mark = [time.perf_counter()]

    def lap(name: str) -> None:
        torch.cuda.synchronize()
        now = time.perf_counter()
        laps[name] = laps.get(name, 0.0) + now - mark[0]
        mark[0] = now

    host = []
    for s in range(a.trials):
        torch.manual_seed(s)
        host.append([torch.randn(a.n), torch.randn(a.n)])
    lap("host_inputs(cpu)")
    pinned = a.variant == "pinned"
    if pinned:
        host = [[t.pin_memory() for t in h] for h in host]
        lap("pin_inputs(cpu)")
        outbufs = [[torch.empty(a.n, pin_memory=True) for _ in range(2)] for _ in range(a.trials)]
        lap("pin_outputs(cpu)")
    mark[0] = time.perf_counter()
    t_lease = time.perf_counter()
    trials = [[t.to(dev, non_blocking=pinned) for t in h] for h in host]
    lap("h2d")
    m64 = copy.deepcopy(model).to(torch.float64)
    shipped = []
    with torch.no_grad():
        for i, inputs in enumerate(trials):
            x, y = (t.clone() for t in inputs)
            lap("clone")
            o = torch.relu(x + y)
            lap("forward")
            x64, y64 = (t.clone().double() for t in inputs)
            lap("as_double")
            o64 = m64(x64 + y64)
            lap("forward64")
            r = (o64 - o.double()).float()
            lap("residual")
            if pinned:
                outbufs[i][0].copy_(o, non_blocking=True)
                outbufs[i][1].copy_(r, non_blocking=True)
                shipped.append(outbufs[i])
            else:
                shipped.append([o.to("cpu"), r.to("cpu")])
            lap("d2h")
    lease = time.perf_counter() - t_lease
    print(f"variant={a.variant} n={a.n} lease={lease:.3f}s", {k: round(v, 4) for k, v in laps.items()})


if __name__ == "__main__":
    main()
