"""The bottom floor: what every stage shares (mesh, optimizers, train state, checkpoints,
the workdir format, FLOPs, logging of rates, user errors and CLI plumbing).

It imports no other folder of the project; data/, models/, pretrain/, finetune/ and
bench/ build on it (the layers contract in .importlinter).
"""
