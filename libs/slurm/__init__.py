"""Slurm as a home for Teto's agents: pure rules (``pilot``: the pilot job's sbatch arguments, script and
settings file; ``rules``: Slurm states beside Teto's, the drain reason, the time limit against a job's ceiling)
and the one edge that runs Slurm's commands (``commands``). Both the CLI (teto/slurm) and the health service's
Slurm provisioner use them.
"""
