"""The planner (`paravt-jax plan`): per-device memory and a lower-bound time per RL step of a
recipe on a mesh, before a run. workload.py turns the recipe into episodes, rows, micro-batches
and sampler calls; arrays.py counts sharded arrays and estimates activations; memory.py and
programs.py compile the real programs (XLA on fake devices, or the TPU compiler) for the target
targets.py resolves, and read their memory and cost analyses; time_plan.py turns costs into
seconds on a chip; plan.py puts the phases together and formats them."""
