"""Trainer integrations: envsdk environments and schedulers inside existing RL trainers.

Each integration is its own submodule and imports its trainer only when imported, so this
package costs nothing to import:

* `envsdk.integrations.trl` — TRL's ``GRPOTrainer``: an ``environment_factory`` adapter, a
  ``rollout_func`` driven by an envsdk scheduler (vLLM or the trainer's model for generation),
  and the environment's reward as a weighted reward column.
"""
