"""What one input may hold: the bounds every reader of a profile, a cluster, a request or a schedule holds it to,
the API's uploads and the command line's files and options alike (issue 14: one request must not take the host
down; a number past them is refused with the field's name, not an overflow, a hang or a traceback later).

Each bound is far above what any published training run uses and far below what overflows a float, a database
column or the host's memory:

* ``MAX_LAYERS``: layers of a profile; the largest published models have ~130 transformer blocks (Llama 3.1
  405B: 126; Megatron-LM's 1T model of Narayanan et al. 2021, table 1: 128).
* ``MAX_SIZES``: micro-batch sizes measured per layer.
* ``MAX_SIZE``: a micro-batch size or a tensor-parallel size, as a key of a profile's tables (2**20).
* ``MAX_NODES``, ``MAX_GPUS_PER_NODE``: a cluster (a DGX holds 8 GPUs, an NVL72 rack 72); ``MAX_GPUS``: their
  product, the most GPUs a configuration's t or W may span.
* ``MAX_PLAN_GPUS``: GPUs of one plan; each divisor of the budget is a (t, D, W) to try.
* ``MAX_GLOBAL_BATCH``: samples per iteration, hence micro-batches per iteration: GPT-3 used 1536 sequences
  (Brown et al. 2020, table 2.1), Llama 3 405B 2048-4096 (Llama 3 report, section 3.4.1).
* ``MAX_TOP``: candidates a stored plan keeps (the API); ``MAX_KEPT``: candidates one search may keep and rank (the
  command line's ``--top``; a GPT-3 175B search on 1024 GPUs evaluates about 8,000 configurations).
* ``MAX_COUNT``: parameters of one layer, bytes of one tensor: 2**53, the largest integer a float holds exactly.
* ``MAX_FLOPS``: FLOP/s of one device (an H100's dense bf16 peak is 9.9e14); ``MIN_FLOPS`` (1e6) and
  ``MIN_BANDWIDTH`` (1e6 bytes/s) the least (a 1990s CPU did more): below them nothing would be planned that
  could run, and a figure like 5e-324 made every cost infinite or NaN instead of a refusal naming the field.
* ``MAX_SECONDS``: one measured or given time (a layer's pass, a link's latency, a per-action overhead).
* ``MAX_MEMORY_BYTES``, ``MAX_BANDWIDTH``: one device's memory (1 PiB) and memory bandwidth (bytes/s).
* ``MAX_LINK_SECONDS``: a link's alpha (s) or beta (s/byte).
* The shape of a transformer (:class:`planner.model.ModelSpec`, :class:`planner.profile.TransformerShape`, a
  Hugging Face config's fields): ``SHAPE_LIMITS``, ``MAX_LAYERS - 2`` blocks (a profile holds them, the embedding
  and the head), hidden size 2**20 (GPT-3 175B: 12288, the 1T model: 25600), 2**14 heads, MLP width 2**22, a
  vocabulary of 2**24 tokens (the largest published hold 256k), a sequence of 2**24 tokens (Llama 4 Scout's
  context: 10M), 2**14 experts per layer (DeepSeek-V3: 256).
* ``MAX_ITERATIONS``: iterations one job or run measures (a job's ``iterations``, a Slurm export's).
* ``MAX_CALIBRATION_RUNS``: finished runs one calibration fit reads (the API's newest jobs of a cluster,
  ``pipeplan calibrate --runs``): each costs a few simulations per round of the fit; 1000 runs took 48 s here.
* ``MAX_STAGES``: stages of one pipeline (devices x model chunks, or x 2 waves): each stage holds at least one
  layer of the model, so at most ``MAX_LAYERS``. (A Hanayo template's build grows with the square of its stages:
  4 devices x 1024 waves took 42 s here.)
* ``MAX_SCHEDULE_UNITS``: a schedule of given stage times that ``simulate`` and ``show`` build, as stages x
  micro-batches (each a forward and a backward), Chimera's stage replicas (devices x 2 pipelines) counted as
  stages: 2**18 units took 4-19 s and 0.3-0.9 GB to build and simulate here (``pipeplan simulate``: 1F1B at 512 x
  512 4.1 s, GEMS 512 x 512 13 s, Chimera 512 x 512 12 s, Hanayo 4 x 128 waves x 512 19 s); 2**20 took over a
  minute for Chimera and GEMS, and Chimera's 512 x 512 with 256 pipeline pairs held 5.7 GB. A plan's schedules
  are held to ``MAX_GLOBAL_BATCH`` micro-batches and ``MAX_STAGES`` stages instead.
"""

from __future__ import annotations

__all__ = ["MAX_BANDWIDTH", "MAX_CALIBRATION_RUNS", "MAX_COUNT", "MAX_FLOPS", "MAX_GLOBAL_BATCH", "MAX_GPUS",
           "MAX_GPUS_PER_NODE", "MAX_ITERATIONS", "MAX_KEPT", "MAX_LAYERS", "MAX_LINK_SECONDS", "MAX_MEMORY_BYTES",
           "MAX_NODES", "MAX_PLAN_GPUS", "MAX_SCHEDULE_UNITS", "MAX_SECONDS", "MAX_SIZE", "MAX_SIZES", "MAX_STAGES",
           "MAX_TOP", "MIN_BANDWIDTH", "MIN_FLOPS", "SHAPE_LIMITS"]

MAX_LAYERS = 1024
MAX_SIZES = 64
MAX_SIZE = 2**20
MAX_NODES, MAX_GPUS_PER_NODE = 65536, 1024
MAX_GPUS = MAX_NODES * MAX_GPUS_PER_NODE
MAX_PLAN_GPUS = 16384
MAX_GLOBAL_BATCH = 65536
MAX_TOP = 100
MAX_KEPT = 100_000
MAX_COUNT = 2**53
MAX_FLOPS = 1e21
MIN_FLOPS = 1e6
MAX_SECONDS = 1e6
MAX_MEMORY_BYTES = 2**50
MAX_BANDWIDTH = 1e16
MIN_BANDWIDTH = 1e6
MAX_LINK_SECONDS = 1e3
SHAPE_LIMITS = {"layers": MAX_LAYERS - 2, "hidden": 2**20, "heads": 2**14, "kv_heads": 2**14, "head_dim": 2**20,
                "ffn_hidden": 2**22, "vocab": 2**24, "seq": 2**24, "experts": 2**14}
MAX_STAGES = MAX_LAYERS
MAX_ITERATIONS = 1_000_000
MAX_CALIBRATION_RUNS = 100
MAX_SCHEDULE_UNITS = 2**18
