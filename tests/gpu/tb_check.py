#!/usr/bin/env python3
"""gpu-check step 6: rn-train --tensorboard's folder read by TensorBoard's own
EventAccumulator, against rn-info's reading of it and the JSONL log of the same runs.

usage: tb_check.py DIR RN_INFO_TXT LOG.jsonl [EXPECT_LOSS_SCALE]

DIR: the --tensorboard folder; RN_INFO_TXT: `rn-info DIR` (lines 'TAG STEP VALUE', text
as 'TAG STEP "..."', '# FILE: VERSION'); LOG.jsonl: the runs' --log; EXPECT_LOSS_SCALE 1:
the runs used --amp fp16, so train/loss_scale must be there.
The last line printed is 'ok ...', 'skipped ...' (no tensorboard package) or 'FAIL ...';
the exit status is 0 unless the check itself could not run its inputs.
"""
import json
import struct
import sys


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main():
    tb_dir, info_txt, log_path = sys.argv[1:4]
    want_scale = len(sys.argv) > 4 and sys.argv[4] == "1"
    try:
        from tensorboard.backend.event_processing import event_accumulator as ea
    except Exception as e:  # not installed, or broken: say so, do not fail
        print(f"skipped tensorboard is not importable here ({type(e).__name__}: {e})")
        return
    acc = ea.EventAccumulator(tb_dir, size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    problems = []

    # rn-info's reading: every scalar, and the text
    mine, texts = {}, {}
    for line in open(info_txt):
        if line.startswith("#") or not line.strip():
            continue
        tag, step, value = line.rstrip("\n").split(" ", 2)
        if value.startswith('"'):
            texts[(tag, int(step))] = json.loads(value)
        else:
            mine[(tag, int(step))] = f32(float(value))

    want = ["train/loss", "train/lr", "train/img_s", "train/data_wait", "val/top1", "val/top5", "val/loss"]
    if want_scale:
        want.append("train/loss_scale")
    for t in want:
        if t not in tags.get("scalars", []):
            problems.append(f"no scalar tag {t} (tensorboard sees {sorted(tags.get('scalars', []))})")
    n = 0
    for t in tags.get("scalars", []):
        ev = acc.Scalars(t)
        steps = [e.step for e in ev]
        if any(a >= b for a, b in zip(steps, steps[1:])):
            problems.append(f"{t}: steps not strictly increasing in TensorBoard's reading: {steps}")
        theirs = {(t, e.step): f32(e.value) for e in ev}
        ours = {k: v for k, v in mine.items() if k[0] == t}
        if theirs != ours:
            diff = sorted(set(theirs.items()) ^ set(ours.items()))[:4]
            problems.append(f"{t}: TensorBoard and rn-info differ: {diff}")
        n += len(ev)

    # the JSONL log's values at the steps the event files hold
    for rec in map(json.loads, open(log_path)):
        k = rec["step"]
        if rec["kind"] == "step" and ("train/loss", k) in mine:
            if mine[("train/loss", k)] != f32(rec["loss"]) or mine[("train/lr", k)] != f32(rec["lr"]):
                problems.append(f"step {k}: loss/lr differ from the log: {rec}")
            if want_scale and mine.get(("train/loss_scale", k)) != f32(rec["loss_scale"]):
                problems.append(f"step {k}: loss scale differs from the log: {rec}")
        if rec["kind"] == "epoch" and "val_top1" in rec and ("val/top1", k) in mine:
            if abs(mine[("val/top1", k)] - rec["val_top1"]) > 1e-6:
                problems.append(f"step {k}: val/top1 differs from the log: {rec}")

    # the flags through TensorBoard's text plugin
    text_tags = acc.PluginTagToContent("text") if "text" in acc.ActivePlugins() else {}
    if "run/flags" not in text_tags:
        problems.append(f"run/flags is not a text-plugin tag (text tags: {sorted(text_tags)})")
    else:
        got = {("run/flags", e.step): e.tensor_proto.string_val[0].decode() for e in acc.Tensors("run/flags")}
        if got != texts:
            problems.append(f"run/flags: TensorBoard reads {sorted(got)}, rn-info {sorted(texts)}")

    if problems:
        for p in problems:
            print(p)
        print(f"FAIL {len(problems)} problems; first: {problems[0][:200]}")
    else:
        print(f"ok EventAccumulator reads {n} scalars in {len(tags['scalars'])} tags and the run/flags text, "
              f"equal to rn-info's reading and the log")


if __name__ == "__main__":
    main()
