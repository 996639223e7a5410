"""`paravt-jax eval`: the flags of the benchmark driver (paravt_jax/eval/driver.py)."""
from __future__ import annotations

import os

from absl import flags

from paravt_jax.config import config_path
from paravt_jax.config_checks import check_config
from paravt_jax.eval import driver
from paravt_jax.flags import define_config, parse_flags


def main(argv: list[str]) -> dict:
    default = config_path("eval")
    flag_values = flags.FlagValues()
    define_config(flag_values, default + ":synthetic", argv)
    flags.DEFINE_string("output_dir", "", "where per-dataset JSON and summary_all.json go",
                        flag_values=flag_values)
    flags.DEFINE_integer("shard_id", 0, "this host's shard", flag_values=flag_values)
    flags.DEFINE_integer("num_shards", 1, "shards across hosts", flag_values=flag_values)
    flags.DEFINE_integer("limit", 0, "samples per dataset (0 = all)", lower_bound=0, flag_values=flag_values)
    flags.DEFINE_bool("compare", False, "parallel vs sequential dispatch side by side", flag_values=flag_values)
    flags.DEFINE_bool("overwrite", False, "drop records another checkpoint or other settings left in --output_dir "
                      "(without it such a directory is refused)", flag_values=flag_values)
    parse_flags(flag_values, argv, "usage: paravt-jax eval [--config=FILE[:ARG]] [--config.FIELD=VALUE ...] "
                "[--output_dir=DIR] [--limit=N] [--compare] [--overwrite] [--shard_id=I --num_shards=N]\n\n"
                "The benchmark driver: per-dataset JSON (resumable) and summary_all.json in --output_dir.",
                show_config=True)
    config = flag_values.config
    check_config(config)
    driver.dataset_names(config)
    output_dir = flag_values.output_dir or config.output_dir or os.path.join("runs", "eval")
    return driver.evaluate_command(config, output_dir, shard_id=flag_values.shard_id, num_shards=flag_values.num_shards,
                            limit=flag_values.limit, compare=flag_values.compare, overwrite=flag_values.overwrite)
