"""Every bench script runs here with its smallest arguments, so a bench cannot crash unnoticed.
Each runs in a fresh directory (benches that build the built-in assets write them there)."""
import os
import subprocess
import sys

from conftest import FAST_COMPILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_bench(tmp_path, script: str, *args: str, timeout: int = 900, fast_compile: bool = True) -> str:
    """Runs a bench script under the suite's XLA flags, tests/conftest.py's faster compilation
    included (here a bench is checked for running and printing its tables; its timings are not
    read), unless `fast_compile` is False."""
    env = dict(os.environ, PYTHONPATH=ROOT, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
    if not fast_compile:
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(FAST_COMPILE, "").strip()
    result = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), *args], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


def test_train_step_bench_smallest(tmp_path):
    """The memory table and the throughput table (one implementation: each compile is costly)."""
    out = run_bench(tmp_path, "train_step.py", "--presets", "tiny", "--lengths", "128",
                    "--speed-lengths", "128", "--repeats", "0", "--remat", "--attention", "blockwise")
    assert "Gradient step peak" in out and "| tiny   | blockwise | 128" in out
    assert "blockwise tokens/s" in out


def test_sampler_bench_smallest(tmp_path):
    out = run_bench(tmp_path, "sampler.py", "--presets", "tiny", "--batches", "1", "--prompt", "16",
                    "--new", "4", "--repeats", "1")
    assert "tiny" in out and "|" in out
    assert "shared MiB" in out and "copied/shared" in out  # the cache layouts, measured side by side


def test_decode_bench_smallest(tmp_path):
    """The bounded decode read and the paged one against the full read: same greedy tokens (the
    bench exits non-zero otherwise), every row of the tables printed."""
    out = run_bench(tmp_path, "decode.py", "--prompts", "1", "--samples", "2", "--prompt", "16", "--new", "4",
                    "--turns", "0", "--repeats", "1")
    assert "| capacity " in out and "| used " in out and "| paged " in out
    assert "| paged, XLA " in out  # the paged read beside the contiguous one, outputs checked equal


def test_queued_bench_smallest(tmp_path):
    """Rows refilled as samples end against calls one after another: the same tokens (the bench
    exits non-zero otherwise), every arm's row printed."""
    out = run_bench(tmp_path, "queued.py", "--model", "tiny", "--prompts", "5", "--slots", "2", "--prompt", "12",
                    "--new", "8", "--mean", "4", "--repeats", "1")
    assert "| calls of --slots prompts, one after another " in out and "| one call, rows refilled" in out


def test_turns_bench_smallest(tmp_path):
    """Episodes' turns refilled row by row against round by round: the same tokens (the bench
    exits non-zero otherwise), every arm's row printed."""
    out = run_bench(tmp_path, "turns.py", "--model", "tiny", "--prompts", "2", "--samples", "2", "--prompt", "12",
                    "--turns", "2", "--chunk", "8", "--new", "8", "--mean", "4", "--repeats", "1")
    assert "| round by round (generate + extend) " in out and "| rows refilled turn by turn" in out


def test_subagent_rows_bench_smallest(tmp_path):
    """Sub-agent prompts in the turns' rows against in calls of their own: the same turns and
    summaries (the bench exits non-zero otherwise), every arm's row printed."""
    out = run_bench(tmp_path, "subagent_rows.py", "--model", "tiny", "--prompts", "2", "--samples", "2", "--prompt",
                    "12", "--turns", "2", "--chunk", "8", "--new", "8", "--mean", "4", "--subagents", "2",
                    "--subagent-prompt", "8", "--subagent-new", "4", "--spare", "2", "--repeats", "1")
    assert "| round by round (generate, sub-agent call, extend) " in out
    assert "| turns refilled, sub-agents in calls of their own " in out
    assert "| turns refilled, sub-agents in the turns' free rows " in out and "free rows and 2 spare" in out


def test_prompt_packing_bench_smallest(tmp_path):
    """The packed prompt prefill beside the padded one, same greedy tokens (else it exits non-zero)."""
    out = run_bench(tmp_path, "prompt_packing.py", "--model", "toy", "--calls", "first_turn", "--repeats", "1")
    assert "| first_turn | padded | 4 x 1024" in out and "| first_turn | packed |" in out


def test_forward_bench_smallest(tmp_path):
    out = run_bench(tmp_path, "forward.py", "--presets", "tiny", "--batch", "1", "--length", "96",
                    "--repeats", "1")
    assert "tiny" in out and "|" in out


def test_dispatch_bench_smallest(tmp_path):
    out = run_bench(tmp_path, "dispatch.py", "--minutes", "2", "--max-k", "1", "--turn-tokens", "4")
    assert "|" in out


def test_eval_bench_smallest(tmp_path):
    out = run_bench(tmp_path, "eval.py", "--samples", "2", "--batch", "2", "--nframes", "2",
                    "--max-new-tokens", "4")
    assert "batched / one at a time" in out


def test_video_bench_smallest(tmp_path):
    out = run_bench(tmp_path, "video.py", "--minutes", "4.5", "--fps", "1", "--repeats", "1")
    assert "K crops in one turn" in out


def test_rl_step_bench_smallest(tmp_path, builtin_root):
    """Both shape policies on the tiny preset, each in its own process, from the same seed: the
    table, the compile counts, and the same metrics at step 0, where both arms hold the same
    parameters (the shape policy changes padding only). One step: from step 1 on the arms'
    policies differ by Adam's first update of a float-noise gradient (every group here scores
    alike: the tiny model earns the format reward only), which their different vision padding
    rounds apart; with a learning rate of 1e-12 they agree at every step (2026-12-03)."""
    small = ("--config.rl.eval_every=0 --config.rl.prompts_per_step=1 --config.rl.samples_per_prompt=2 "
             "--config.rl.rollout.max_new_tokens=24 --config.rl.rollout.max_turns=1 "
             f"--config.data.num_train=8 --config.data.num_eval=2 --config.data.builtin_root={builtin_root}")
    out = run_bench(tmp_path, "rl_step.py", "--config", os.path.join(ROOT, "configs/paragrpo.py:tiny"),
                    "--steps", "1", "--warmup", "0", f"--extra={small}", "--workdir", str(tmp_path / "arms"),
                    timeout=1500)
    assert "RL step: previous shapes vs fixed shapes" in out and "speed-up of the median step" in out
    for metric in ("reward", "kappa", "loss_tokens", "loss", "grad_norm"):
        assert f"| {metric}" in out
    assert "differs" not in out, out


def test_accelerator_bench_smallest(tmp_path):
    """bench/accelerator.py on CPU with its smallest arguments: the parity, sampler and train
    tables, cudnn listed as GPU-only (not substituted), and the JSON under --out."""
    import json

    out = run_bench(tmp_path, "accelerator.py", "--smallest", "--out", str(tmp_path / "out"),
                    "--attention", "dense,blockwise,cudnn")
    assert "Greedy tokens of tiny: this device vs CPU" in out and "n/a: gpu only" in out
    saved = json.loads((tmp_path / "out" / "accelerator.json").read_text())
    assert saved["greedy_parity"]["equal"] is True
    assert saved["sampler"]["decode_tokens_per_s"] > 0 and saved["sampler"]["prefill_tokens_per_s"] > 0
    ran = [r for r in saved["train"] if "tokens_per_s" in r]
    assert {r["attention"] for r in ran} == {"dense", "blockwise"} and all(r["planned_gradient_bytes"] > 0 for r in ran)
    assert any(r.get("skipped") == "cudnn runs on gpu only" for r in saved["train"])


def test_vision_shards_bench_smallest(tmp_path):
    """bench/vision_shards.py on the suite's 8 fake devices: both layouts compiled and timed, and
    the per-shard pass holds fewer temporaries per device than the replicated one."""
    out = run_bench(tmp_path, "vision_shards.py", "--frames", "2", "--repeats", "0")
    assert "vision replicated vs per shard" in out
    row = next(line for line in out.splitlines() if line.startswith("| 2 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[3].replace(",", "")) < float(cells[2].replace(",", "")), row


def test_cpu_threads_bench_smallest(tmp_path, builtin_root):
    """The fixed count's two arms (1 core and every core) of 2 tiny SFT steps: the table, and the
    arms agree with each other bit for bit (the machine-sized pool's arms: `--arms all`, the
    default)."""
    out = run_bench(tmp_path, "cpu_threads.py", "--config", os.path.join(ROOT, "configs/paragrpo.py:tiny"),
                    "--steps", "2", "--arms", "fixed",
                    f"--extra=--config.data.builtin_root={builtin_root} --config.sft.batch_size=2",
                    fast_compile=False)
    assert "XLA:CPU thread count" in out
    fixed = [line for line in out.splitlines() if "(fixed)" in line]
    assert len(fixed) == 2 and all(line.rstrip(" |").endswith("yes") for line in fixed), out


def test_cpu_isa_bench_smallest(tmp_path, builtin_root):
    """Two arms (the pinned vector extension and the host's own) of 2 tiny SFT steps: the table,
    the pinned arm its own reference, and the host's own kernels computing other bits (the
    platform-dependent reciprocal square root differs on every x86 host, so the comparison can
    fail). (--emulate needs QEMU: measured in docs/benchmarks.md.)"""
    out = run_bench(tmp_path, "cpu_isa.py", "--config", os.path.join(ROOT, "configs/paragrpo.py:tiny"),
                    "--steps", "2", f"--extra=--config.data.builtin_root={builtin_root} --config.sft.batch_size=2")
    assert "XLA:CPU vector extension" in out
    rows = [line for line in out.splitlines() if line.startswith("| pinned") or line.startswith("| native")]
    assert len(rows) == 2 and rows[0].rstrip(" |").endswith("yes (2 steps)"), out
    assert "| no (from step" in rows[1], out


def test_host_pages_bench_smallest(tmp_path, builtin_root):
    """Two tiny SFT steps with glibc's default allocator and with huge pages: the table, and
    the huge-page run's metrics equal the default's bit for bit."""
    out = run_bench(tmp_path, "host_pages.py", "--config", os.path.join(ROOT, "configs/paragrpo.py:tiny"),
                    "--steps", "2", "--repeats", "1",
                    f"--extra=--config.data.builtin_root={builtin_root} --config.sft.batch_size=2",
                    fast_compile=False)
    assert "Host allocator pages" in out
    runs = [line for line in out.splitlines() if line.startswith("| 1 ")]
    assert len(runs) == 2 and all(line.rstrip(" |").endswith("yes") for line in runs), out


def test_append_bench_smallest(tmp_path):
    """bench/append.py at 20 and 80 appends: both arms read back as the local file with nothing
    left beside it; the Appender's requests per append and bytes sent per file byte stay flat
    as the file grows (linear), where re-uploading the file grows with it (quadratic)."""
    out = run_bench(tmp_path, "append.py", "--appends", "20,80", "--line-bytes", "100")
    assert "gs:// appends" in out
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0].isdigit():
            rows[(int(cells[0]), cells[1].split(" ")[0])] = cells
    assert len(rows) == 4 and all(r[7] == "yes" and r[8] == "0" for r in rows.values()), out
    compose = [float(rows[(n, "part")][5]) for n in (20, 80)]
    rewrite = [float(rows[(n, "whole")][5]) for n in (20, 80)]
    assert all(float(rows[(n, "part")][3]) <= 3.2 for n in (20, 80)), out
    assert abs(compose[1] - compose[0]) < 0.1 * compose[0] and rewrite[1] > 3 * rewrite[0], out


def test_sft_vision_cache_bench_smallest(tmp_path, builtin_root):
    """bench/sft_vision_cache.py on tiny (its tower frozen by the bench), one set of 2 rows, 2
    steps an arm: both arms in the table, the cached arm's encoding and kept features shown."""
    out = run_bench(tmp_path, "sft_vision_cache.py", "--config", os.path.join(ROOT, "configs/paragrpo.py:tiny"),
                    "--sets", "toy", "--rows", "2", "--batch", "2", "--steps", "2",
                    "--set", f"data.builtin_root={builtin_root}")
    assert "pixels every step vs vision features cached once" in out
    pixels = next(line for line in out.splitlines() if line.startswith("| toy ") and "| pixels " in line)
    cached = next(line for line in out.splitlines() if line.startswith("| toy ") and "| cached " in line)
    assert [c.strip() for c in pixels.split("|")][7:9] == ["0.0", "0"]
    assert int(cached.split("|")[8]) > 0 and float(cached.split("|")[9]) > 0, out


def test_rollout_shards_bench_smallest(tmp_path):
    """bench/rollout_shards.py on the suite's 8 fake devices: the rollout's vision pass per shard
    of rows holds fewer argument bytes per device than the replicated one, same greedy tokens."""
    out = run_bench(tmp_path, "rollout_shards.py", "--samples", "1", "--frames", "2", "--crops", "1")
    assert "replicated vs per shard of rows" in out and "greedy tokens equal under both layouts: True" in out
    for call in ("prompt", "extend"):
        row = next(line for line in out.splitlines() if line.startswith(f"| {call} ") and "| vision " in line)
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[5]) < float(cells[4]), row


def test_program_bytes_bench_smallest(tmp_path):
    """bench/program_bytes.py at its smallest: the tiny recipe's gradient program at 2 layers on
    one CPU device, saved and reported again from the saved HLO without compiling (the same
    totals); the 8B-shaped decode step at 3 layers (the fewest the DeepStack taps allow); the tiny
recipe's prompt prefill on 2 devices, split by rows beside the baseline."""
    def summary(out: str, program: str, layers: int) -> str:
        return next(line for line in out.splitlines() if line.startswith(f"{program} at {layers} layers"))

    saved = tmp_path / "grads"
    out = run_bench(tmp_path, "program_bytes.py", "--program", "gradients", "--config", "tiny", "--mesh", "gpu1",
                    "--layers", "2", "--target", "cpu", "--top", "2", "--save", str(saved))
    assert (saved / "module.hlo").exists() and "### by kind" in out
    again = run_bench(tmp_path, "program_bytes.py", "--load", str(saved), "--top", "2")
    assert summary(again, "gradients", 2) == summary(out, "gradients", 2)
    out = run_bench(tmp_path, "program_bytes.py", "--program", "decode", "--layers", "3", "--target", "cpu",
                    "--top", "2")
    assert "GB physical" in summary(out, "decode", 3) and "largest instructions" in out
    out = run_bench(tmp_path, "program_bytes.py", "--program", "decode", "--decode", "decode", "--config", "tiny",
                    "--mesh", "gpu2", "--layers", "2", "--target", "cpu", "--top", "2")
    assert '"decode": "decode"' in out and "GB physical" in summary(out, "decode", 2)  # the recipe's, on 2 devices
    out = run_bench(tmp_path, "program_bytes.py", "--program", "prefill", "--config", "tiny", "--mesh", "gpu2",
                    "--prefill", "first prompt prefill", "--layers", "3", "--target", "cpu", "--top", "2")
    rows = {line.split("|")[1].strip(): [float(c) for c in line.strip("|").split("|")[1:]]
            for line in out.splitlines() if line.startswith(("| every token", "| split by rows"))}
    baseline, split = rows["every token on every device (baseline)"], rows["split by rows"]
    assert split[0] == baseline[0] == 2, rows  # the tiny recipe's 2 prompts, one a device
    # the split prefill reads fewer bytes and moves no activations between the devices
    assert split[3] < baseline[3] and split[5] < baseline[5], rows
    assert "GB physical" in summary(out, "prefill", 3)


def test_every_bench_script_runs_here():
    """Each script under bench/ (but the shared helpers) is run by a test of this file."""
    source = open(__file__).read()
    scripts = sorted(n for n in os.listdir(os.path.join(ROOT, "bench")) if n.endswith(".py") and n != "common.py")
    assert [s for s in scripts if f'"{s}"' not in source] == []
