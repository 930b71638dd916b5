"""Tensor, pipeline and expert parallelism across processes (one rank per process).

Modules, one concept each:

- `config`: the group's sizes, where this rank sits, and validation against a model (pure);
- `comm`: joining the process group and timed collectives (communication is measured);
- `layers`: row-parallel projections, vocab-parallel embedding and LM head, expert-parallel MoE;
- `loader`: building a rank's shard of the model and loading only its shard of the weights;
- `runner`: the model runner all ranks step together (rank 0 broadcasts each step's inputs;
  pipeline stages pass activations over two micro-batches).

The processes of a group (follower ranks and their probes, local rank spawning, failure
handling) are the server's: `frota.server.ranks`.
"""
