"""The planner's two ways to compile (slow tier: the XLA plan again, then every program once
more in one process): compile_in=children and compile_in=process give the same plan."""
from integration.test_plan import gpu_preset_prints_the_time_plan_from_xla
from paravt_jax.planner import plan as P
from paravt_jax.run_config import build_run
from unit import test_plan as unit_tests
from unit.test_plan import MESH8, plan_numbers

xla_plan = unit_tests.xla_plan  # the fixture


def test_each_program_in_its_own_child_gives_the_numbers_of_one_process(xla_plan, tokenizer):
    """compile_in=children (the default: each program in a child process of its own, with its peak
    memory recorded) and compile_in=process (every program in one process: one child with the 8
    fake devices) give the same plan, but for compile seconds and host memory."""
    config, children = xla_plan
    one = P.plan(build_run(config), MESH8, 16, "xla", tokenizer=tokenizer, compile_in="process")
    programs = children.programs
    # the sampler's programs, then the trainer's: scanned (memory) and unrolled (costs), 2 layers
    trainer = [p.name for p in programs.trainer]
    assert [run.label for run in programs.children] == (
        [f"{p.name} [sampler, 2 layers]" for p in programs.sampler]
        + [f"{name} [2 scanned layers]" for name in trainer] + [f"{name} [2 unrolled layers]" for name in trainer])
    assert all(run.peak_bytes > 0 and run.seconds > 0 for run in programs.children)
    assert len(one.programs.children) == 1 and children.host_peak_bytes > 0
    note = next(n for n in children.notes if n.startswith("host memory:"))
    assert f"{len(programs.children)} child processes compiled the programs, one each" in note
    assert plan_numbers(children.to_json()) == plan_numbers(one.to_json())


def test_gpu_preset_prints_the_time_plan_from_xla(tmp_path, builtin_root):
    """`--mesh=gpu8` on fake CPU devices: the H100 time plan and the asynchronous split's table
    (tests/integration/test_plan.py's helper, here for the default tier's time)."""
    gpu_preset_prints_the_time_plan_from_xla(tmp_path, builtin_root)
