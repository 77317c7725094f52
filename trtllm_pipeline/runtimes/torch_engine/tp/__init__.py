"""Real tensor parallelism for the torch runtime: one process per rank, each with its own shard.

``executor`` is the leader's side (rank 0, inside ``TorchRuntime``, which keeps the scheduler),
``worker`` the other ranks' process, ``launcher`` how they are started and die with the leader,
``comm`` the collectives and the command each step broadcasts, ``sharded_model`` one rank's engine,
``mode`` which of merged and distributed runs. docs/architecture.md, "Tensor parallelism", has the picture.
"""
