"""One process of the multi-host test (tests/integration/test_multihost.py), or its single-process baseline.

    python tests/support/multihost_worker.py OUT_DIR COMMAND [paravt-jax flags ...]

Runs `paravt-jax COMMAND ...` through `paravt_jax.cli.main` (which starts the distributed
runtime from the PARAVT_* variables when they are set) and records, into OUT_DIR under this
process's index:
  rollouts_<i>.json  the rollouts this process generated, per RL step: episode, sample,
                     generated token ids and behaviour log-probs;
  writes_<i>.json    every file-system write this process made while the command ran (a
                     Python audit hook: opens for writing, directory creation, renames and
                     removals).
"""
import json
import os
import sys

WRITE_EVENTS = ("os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "shutil.rmtree",
                "shutil.move", "os.link", "os.symlink", "os.truncate")


def _record_writes(log: list, recording: dict):
    def hook(event, args):
        if not recording["on"]:
            return
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            if writing and isinstance(path, (str, bytes, os.PathLike)):
                log.append(["open", os.path.abspath(os.fsdecode(path))])
        elif event in WRITE_EVENTS and args and isinstance(args[0], (str, bytes, os.PathLike)):
            log.append([event, os.path.abspath(os.fsdecode(args[0]))])
    return hook


def _record_rollouts(log: list):
    """Wraps the trainer's run_rollouts so that every call's rollouts are also logged."""
    from paravt_jax.rl import trainer

    real = trainer.run_rollouts

    def run_rollouts(*args, **kwargs):
        rollouts, skipped = real(*args, **kwargs)
        log.append([{"episode": r.episode.episode_id, "sample": r.sample,
                     "tokens": r.inputs.input_ids[r.inputs.loss_mask == 1].tolist(),
                     "logprobs": r.logprobs[r.inputs.loss_mask == 1].tolist()} for r in rollouts])
        return rollouts, skipped

    trainer.run_rollouts = run_rollouts


def main(out_dir: str, argv: list[str]) -> None:
    from paravt_jax import cli
    from paravt_jax.infra import distributed

    writes, rollouts, recording = [], [], {"on": True}
    sys.addaudithook(_record_writes(writes, recording))
    _record_rollouts(rollouts)
    status = cli.main(["paravt-jax", *argv])
    recording["on"] = False
    if status:
        sys.exit(status)
    index = distributed.process_index()
    os.makedirs(out_dir, exist_ok=True)
    for name, value in (("rollouts", rollouts), ("writes", writes)):
        with open(os.path.join(out_dir, f"{name}_{index}.json"), "w") as f:
            json.dump(value, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
