"""``BackendPolicy``: every platform-dependent choice maxjax makes, as one object per platform.

Choices, and what each policy takes (the CPU figures behind them are in ``benchmarks/results/``):

- ``precision``: the ``lax.Precision`` of float32 matmuls. CPU: ``HIGHEST`` (XLA:CPU computes
  float32 products exactly whatever it is told); GPU and TPU: None, XLA's default (TF32 on
  recent NVIDIA GPUs, one bfloat16 pass on TPU): pass a policy with ``HIGHEST`` for exact float32.
- ``encoder_precision``: the ``precision`` an encoder's inference program (sentence embeddings)
  runs at. On the CPU, ``precision=HIGH`` runs a stored float32 ``Linear`` product (K and N
  multiples of 32) in four bfloat16 passes on the AMX tiles where the CPU has AMX-BF16
  (:mod:`maxjax.backend.kernels.amx`; relative error about 2^-16 per product, JAX's class of
  "bfloat16_3x"), exactly elsewhere; the program lays out the weights it only multiplies so once,
  when its state is prepared. CPU with AMX-BF16: ``HIGH`` (all-MiniLM-L6-v2 on a 2-core Sapphire
  Rapids Xeon, ``benchmarks/embed.py``'s workers run alternately HIGH / HIGHEST, twice: 152 / 128-130
  sentences/s at batch 32, 163-169 / 123 at batch 256, batch 1 within noise; cosine to the float32
  reference at least 0.99999 and padding invariance to 1e-6 kept); other CPUs: ``HIGHEST``; GPU
  and TPU: None.
- ``frozen_precision``: the precision of a float32 ``Trainer``'s products with its frozen weights
  (a LoRA fine-tune's base layers), forward and in ``x``'s cotangent (``g @ w``); trainable weights
  and every other product keep ``precision``. ``HIGH`` on the CPU: each frozen float32 weight that
  is multiplied as stored (``Linear``) is laid out for the AMX kernel once, when the Trainer is
  made, together with its transpose (:class:`~maxjax.backend.kernels.amx.AmxWeight`: twice the
  weight's bytes, in place of its stack; a tied embedding, also gathered, keeps its array beside
  them), and both products run in four bfloat16 passes (relative error about 2^-16). CPU with
  AMX-BF16: ``HIGH`` (a SmolLM2 LoRA step, batch 4 x 128, on a 2-core Sapphire Rapids Xeon:
  1.16-1.51x the exact step's tokens/s in processes run alternately and in benchmark runs,
  ``benchmarks/results/train_lora_amx_avx512.txt``; the loss curve the same to 3 decimals);
  other CPUs: ``HIGHEST``; GPU and TPU: None (``precision``).
- ``bfloat16_frozen_kernel``: a bfloat16 ``Trainer``'s frozen weights that the model multiplies as
  stored are laid out once, at construction, for maxjax's AMX kernel with their transposes
  (:class:`~maxjax.backend.kernels.amx.AmxWeight`, bfloat16 tiles: the weight's bytes twice, in
  place of its bits), and multiply there in one bfloat16 pass with float32 sums, forward and in
  ``x``'s cotangent: XLA's bfloat16 dot's arithmetic, without its per-call packing of the weight.
  CPU with AMX-BF16: True (a SmolLM2 LoRA step, batch 4 x 128, 2-core Sapphire Rapids Xeon,
  processes run alternately, 9 pairs: faster in 7, 1.08x on average, CPU seconds per step 3.5-4.3
  -> 3.1-3.7 in the last 4; the step is bound by its other ops: bfloat16 conversions, the
  saved activations); others: False.
- ``quantized_layout``: how a GGUF-quantized weight sits in device memory at run time (a layout
  name of :mod:`maxjax.graph.quantization`). CPU with AVX-512: ``"nibbles"`` (4 bits per value;
  as fast as one byte per value there, for half the memory); CPU without it: ``"unpacked"`` (one
  byte per value: XLA:CPU's 256-bit code unpacks nibbles slowly); GPU and TPU: ``"unpacked"``.
- ``mapped_encodings``: GGUF encodings whose weights are read in place from the mapped file (the
  ``mapped`` layout, :class:`~maxjax.graph.quantization.MappedArray`) when the program runs on one
  device and ``quantized_layout`` was not asked for: loading them is mapping the file, as
  llama.cpp's is, and their memory is the file's page cache; other encodings take
  ``quantized_layout``. CPU with AVX-512 where the kernels build: ``("Q4_0", "Q8_0")`` (2-core
  AVX-512 Xeon, Llama-3.2-1B-shaped files, fresh processes alternately, same tokens: Q4_0 load
  1.6-1.7 -> 1.1 s, resident after the load 906 -> 245 MB, decode 1.06x and 0.96x ``nibbles``;
  Q8_0 load 2.4-3.5 -> 0.8-1.0 s, resident 1570 -> 268 MB, decode 1.28x and 1.11x ``unpacked``.
  Its kernel looks Q4_0 values up in a per-block table of ``d * (q - 8)`` and reads each of its
  two row streams about 450 blocks ahead along its own rows (8 KiB of Q4_0, 16 KiB of Q8_0: on
  a 2-core Zen 5 EPYC, Q8_0 decode went 0.84x -> 1.04x llama.cpp against 8 KiB, and 8B Q4_0
  0.93x -> 1.08x once the distance ran along each stream's rows); ``benchmarks/results/
  scale_mapped_avx512.txt`` and ``scale_zen5_avx512.txt`` have 1B to 8B against llama.cpp).
  AVX2 CPUs (no 16-entry table in one register; unmeasured), GPU, TPU: ``()``.
- ``mapped_float_tensors``: a float tensor of a mapped file (safetensors, a GGUF's F32/F16/BF16
  tensors) that the model keeps as stored (no conversion, row order or stacking: the per-layer
  weights of ``layer_weights="per_layer"``, the embedding, norms) and that starts on a 64-byte
  boundary is adopted where it lies in the map (JAX's CPU client adopts such host memory without
  a copy), as the ``mapped`` layout does for GGUF blocks: loading it is mapping the file, and its
  memory is the file's page cache (shared, and not resident until read); others take one copy.
  Safetensors' data and GGUF's 32-byte aligned tensors start on such a boundary for about 1 in 8
  and 1 in 2 files (a file's tensors share their offset modulo 64). The file must not be
  modified while the model lives (the OS then kills the process with SIGBUS). CPU: True
  (2-core Zen 5 EPYC, ``benchmarks/scale.py``: a Llama-3.2-1B-shaped bfloat16 directory loads in
  0.26 s against 1.46 s copied, the same peak RSS once decoding has read every page; its F16
  GGUF in 0.49 s against 1.75 s, llama.cpp 0.26-0.27 s); GPU and TPU: False (their weights are
  copied to device memory).
- ``tiled_encodings``: GGUF encodings whose weights take the ``tiles`` layout
  (:class:`~maxjax.graph.quantization.TiledArray`: copied at load into tiles of 16 rows, integer
  dots with Q8_0 activations at any number of rows) when the program rounds activations to Q8_0
  (``q8_activations``: ``load_model(arithmetic="q8_0")``), runs on one device and no
  ``quantized_layout`` was asked for; they then take it instead of ``mapped_encodings``. CPU with
  AVX-512 (F, BW) where the kernels build: ``("Q4_0", "Q4_1")`` (2-core Zen 5 EPYC,
  ``benchmarks/scale.py``, a Llama-3.2-1B-shaped Q4_0 against ``mapped`` with Q8_0
  activations: decode 48.8 -> 59.0 tokens/s, 128-token TTFT 0.69 -> 0.33 s; 1B-, 3B- and
  8B-shaped Q4_0 against llama.cpp with its own repacking, one run: decode 1.12x, 1.10x and
  1.13x, TTFT 0.78x, 0.74x and 0.82x, peak RSS 0.74x, 0.60x and 0.57x, load 1.23x, 1.10x and
  1.03x, ``benchmarks/results/scale_tiles_zen5_avx512.txt``); others: ().
- ``q8_activations``: every product with a GGUF-quantized weight (any layout but ``int8``) takes
  its activations rounded to Q8_0 blocks, per 32 values (llama.cpp's ``quantize_row_q8_0``):
  llama.cpp's arithmetic (``ggml_vec_dot_q4_0_q8_0``, ``_q4_1_q8_1``, ``_q8_0_q8_0``), and MAX's
  on the CPU (its K-quant kernels quantize the activations to Q8_K), not the file's float32
  product. In maxjax's kernel those are integer dots (vpdpbusd, or vpmaddubsw without VNNI),
  scaled by both blocks' scales afterwards (:func:`maxjax.backend.kernels.quantized_matmul`;
  ``nibbles``, ``mapped`` and ``unpacked`` weights with a scale per 32 values); elsewhere (a
  prompt's GEMM, Q6_K) the activations are rounded
  (:func:`maxjax.graph.quantization.blocks.q8_0_round`) and multiplied in float32: the same
  values on every path. Such a program's compile keeps YNNPACK's reductions out (only its dots:
  jaxlib 0.10.2 computed one of them wrongly in a prompt of 15 rows or more of the tests' tiny
  Llama, logits 1.4% off where every other path agreed to 3e-7). Asked for by
  ``load_model(arithmetic="q8_0")`` (``--arithmetic q8_0``); every platform: False. Not the
  default, although it is faster where the kernel runs and as accurate as llama.cpp: rounding
  turns the float32 differences between paths (a batch's products, weight-left GEMMs) into
  whole quantization steps, so a row's tokens may change with the rows decoded beside it
  (float32 keeps the serving engine's rows equal to ``generate``'s). 2-core Zen 5 EPYC, decode
  steps against float32 activations: a Llama-3.2-1B-shaped Q4_0 1.37x at batch 1, 1.12x at 4,
  0.94x at 16, 1.00x at 32; its Q8_0 0.98x at batch 1, bound by memory either way; SmolLM2 Q4_1
  1.21x, 1.09x, 0.95x, 1.04x (since the float32 kernel reads each Q4_0 block's scale alone and
  four rows a pass, whole batch-1 decode only 1.02x / 1.04x / 1.07x at 1B / 3B / 8B and 1.19x at
  SmolLM2, ``benchmarks/results/scale_zen5_avx512.txt``; with Q4_0 and Q4_1 in the ``tiles``
  layout, see ``tiled_encodings``, SmolLM2 1.22x at batch 1, 1.42x at 16 and 1.92x on a
  128-token prompt, ``benchmarks/results/generate_tiles_zen5_avx512.txt``); held-out perplexity of SmolLM2 (teacher-forced batch-1 decode
  steps) +0.53% (Q4_1) and +0.51% (requantized to Q4_0 by llama.cpp), where llama.cpp's own is
  +0.54% and +0.54%: 24.3979 against 24.3988, 31.0219 against 31.0313
  (``benchmarks/results/q8_activations_zen5_avx512.txt``).
- ``release_freed_heap``: after a load, after each compile of a model's programs
  (``CausalLM``'s generation, the serving engine's warmup and steps) and at the end of each
  ``CausalLM`` generation, the process returns the memory freed since (by XLA's compiler, by a
  prompt's temporary buffers) to the operating system (glibc's ``malloc_trim``,
  :func:`maxjax.backend.cpu.release_freed_heap`): glibc otherwise keeps it in its per-thread
  arenas, resident, and the next prompt's buffers land beside it. CPU: True (Llama-3.2-1B-shaped
  Q4_0 on a 2-core Zen 5 EPYC, a 128-token prompt and 64 tokens: peak RSS 1113 -> 1062 MB,
  resident afterwards 1077 -> 1020 MB; 26-45 ms per compile. At the end of a generation 3.3 ms,
  18 MB, and the peak of a second and third 64-token generation 1080 -> 1064 MB); GPU and TPU:
  False (unmeasured).
- ``compile_decode_first``: a model whose weights are mostly read in place from a mapped file
  (``CausalLM.weights_mapped``: the ``mapped`` layout) compiles its decode step, in its first
  generation at a shape, before it runs the prompt, so that the compiler's transient memory
  (35-55 MB from 1B to 3B) is used and given back before those weights become resident, not on
  top of them (weights copied at load are resident already: nothing to gain).
  The first call's first token comes later by up to the decode compile, its last token no later.
  CPU: True (one generation of 64 tokens after a 128-token prompt, Llama-3.2-1B-shaped Q4_0 on a
  2-core Zen 5 EPYC, two runs each: peak RSS 1084 -> 1058 MB, first token 1.8 -> 2.2-2.4 s, whole
  call 4.4 s both; 3B-shaped: 2276 -> 2220 MB, first token 3.3-3.6 s both, whole call 8.5-9.2 ->
  8.4-8.5 s); GPU and TPU: False (the weights live in device memory).
- ``weight_left_max_rows``: for ``x @ w.T`` with 2 to this many rows in ``x`` (batched decode),
  compute ``(w @ x.T).T`` with the weight as the GEMM's left operand, behind an
  ``optimization_barrier`` so XLA keeps that order (XLA:CPU's GEMM re-lays a ``[out, in]`` right
  operand on every call). CPU: 16; others: 0 (off).
- ``dequant_row_chunk``: a quantized weight with at least twice this many rows (a multiple of
  it), multiplied by more than one input row, is dequantized and multiplied one block of rows at a
  time (XLA:CPU otherwise writes the whole float32 weight first; an LM head of 49152 rows costs
  more in fresh pages than in arithmetic, and the float32 weights are a prompt's largest
  temporary buffers). CPU: 256. A 128-token prompt on a 2-core Zen 5 EPYC, the prefill program's
  temporary buffers against 1024: 40 -> 22 MB at Llama-3.2-1B Q4_0, 45 -> 26 MB at 3B, 71 -> 35 MB
  at 8B (a block of the 8B's down projection is 14.7 MB at 256 rows); warm time to first token
  0.78 -> 0.74 s, 2.25 -> 2.01 s and 5.7 -> 5.2 s; SmolLM2 unchanged (0.096 s); 128 rows: 1.1 s at
  1B. (1024 against 4096, on a 2-core AVX-512 Xeon: 1B 140 -> 57 MB, 8B 880 -> 180 MB.) Others:
  0 (off).
- ``dequant_col_chunk``: a quantized weight with more columns (input features) than this, and a
  multiple of it, is dequantized and multiplied one block of columns at a time, each block its own
  fusion behind ``optimization_barrier``, and the partial products summed (XLA:CPU's fused
  dequantize-and-dot collapses for 4096 columns and more: a Q4_0 ``[2048, 8192]`` weight times
  one row took 197 ms fused, 3.2 ms in 2048-column blocks; Llama-3.2-1B's ``down_proj``, every
  weight of an 8B). Not for 2 to ``weight_left_max_rows`` input rows (15-30% slower there).
  CPU without maxjax's kernel (see ``native_matmul_max_rows``): 2048; CPU with it: 0 (off: the
  kernel takes the products of 1 to 32 rows that the blocks were for, and a prompt's product
  gains nothing from them while each block is a fusion more to compile: with 128-token
  prompts, Llama-3.2-1B Q4_0 compiled in 2.06 s instead of 2.45 and a Llama-3.1-8B-shaped Q4_0
  in 1.70 s instead of 2.84, prefill and decode as fast, on a 2-core AVX-512 Xeon; AVX2 CPUs
  take the same choice unmeasured); others: 0 (off).
- ``int8_min_rows``: a weight in the ``int8`` quantized layout multiplies at least this many
  input rows as int8 x int8 -> int32 dots (activations quantized per row); fewer rows run in
  float32 (in maxjax's CPU kernel where ``native_matmul_max_rows`` takes them). CPU: 16 (XLA:CPU's int8 dots: 0.1x float32 at one row, 1.7x at 16 and 2.4x at 32 on a
  2-core AVX2 EPYC, ``benchmarks/int8.py``); others: 0 (never). The layout itself is only used
  when asked for (``quantized_layout="int8"``): it is not bit-identical to the file.
- ``native_matmul_max_rows``: a quantized weight in the ``nibbles`` or ``unpacked`` layout that
  multiplies 1 to this many input rows (decode, batched decode, a serving step) runs in maxjax's
  CPU kernel (:mod:`maxjax.backend.kernels`: the same float32 arithmetic, unpacked 16 values per
  instruction, a stacked layer read in place) instead of XLA's fused dequantize-and-dot. 2-core
  AVX-512/AMX Xeon, ``benchmarks/results/native_matmul_avx512.txt``, a Q4_0 ``[8192, 2048]``
  weight: 1 row 2.2 ms -> 0.94 ms, 2 rows 19 -> 1.5 ms, 16 rows 21 -> 6.2 ms, 32 rows 29 -> 12.5 ms
  (1.2x to 17x over every weight and row count measured but one: Q8_0 ``[2048, 2048]`` at one row).
  CPU: 32 where the CPU has AVX-512 (F, BW) or AVX2 with FMA and F16C (the kernel is built for the
  host on first use; without a compiler the products stay in XLA, after one warning); others: 0
  (off). A ``Program`` whose weights span a mesh keeps XLA's products (the SPMD partitioner cannot
  split a custom call).
- ``host_layout_conversion``: GGUF blocks of the common formats (Q4_0, Q4_1 and Q4_K into
  ``nibbles``; those, Q8_0 and Q6_K into ``unpacked``: ``HOST_LAYOUTS``) are converted on the host
  by maxjax's kernel library as they are read out of the mapped file (one pass over the bytes, no
  XLA program to compile, see :mod:`maxjax.backend.kernels.layouts`), instead of being copied out
  and rewritten by an XLA program on the device. CPU where the kernels build: True (the device
  buffers then adopt the host buffers); others: False (XLA converts on the device).
- ``arithmetic``: what ``load_model(arithmetic="auto")`` runs: ``"float32"`` everywhere for now
  (the file's values exactly; ``"int8"`` is asked for explicitly, see ``int8_min_rows``).
- ``grouped_attention``: when attention groups the query heads of each KV head instead of
  repeating the KV heads (Hugging Face's ``repeat_kv``). ``"batched_decode"`` (CPU without
  AVX-512): only for one new token in each of several rows, where XLA:CPU's dots are fastest that
  way; ``"decode"`` (CPU with AVX-512): for one new token per row, any number of rows (with the
  quantized products in maxjax's kernel, the repeated keys and values were the larger cost of a
  batch-1 decode step: 2-core AVX-512/AMX Xeon, 128-token prompt, SmolLM2 65 -> 77 tokens/s,
  Llama-3.2-1B Q4_0 12.4 -> 13.7; prompts and training keep the repeated layout, since XLA:CPU
  has no bfloat16 x bfloat16 -> float32 dot for the grouped one); ``"always"`` (GPU, TPU): never
  materialise repeated keys and values.
- ``encoder_rows``: most rows one compiled pass of an encoder (sentence embeddings) takes; a
  larger batch runs as several passes of similar-length rows, each padded to its own length
  bucket. CPU: 32 (256 rows in one pass cost 2.6x the CPU time of eight 32-row passes on
  all-MiniLM-L6-v2, AVX2, ``benchmarks/embed.py``); GPU and TPU: 256.
- ``layer_weights``: how an inference program holds the float (not quantized) matrices of the
  layers it scans: ``"stacked"`` along a layer axis and sliced by the scan, or ``"per_layer"``, one
  buffer per layer read in place by a ``lax.switch`` (see :mod:`maxjax.graph.layer_weights`).
  XLA:CPU copies a stacked slice before each matmul: 8 float32 ``[2048, 8192]`` layers times one
  row took 193 ms stacked and 37.6 ms per layer (2-core AVX2 EPYC). CPU: ``"per_layer"``;
  others: ``"stacked"``. Training programs stack (``Trainer``).
- ``keep_16bit_weights``: a float32 model of a checkpoint whose matrices are bfloat16 or float16 (a
  Hugging Face directory whose float tensors are all of one of those; a GGUF's F16/BF16 tensors)
  keeps those weights as in the file (half float32's bytes; one copy out of the map at most,
  none with ``mapped_float_tensors``), and each
  product widens them exactly (``matmul_t`` of float32 ``x`` and a stored 16-bit float ``w``:
  every bfloat16 and float16 value is a float32 value, so the arithmetic is float32's, the same
  values as widening at load up to the order of the sums; norms and the embedding are widened as
  they are used). On the CPU those products run in maxjax's kernel
  (:func:`maxjax.backend.kernels.widened_matmul`: 1 to ``widened_kernel_max_rows`` (16) rows
  read the weight in place, widened in registers, each row's sums in the same order whatever rows
  share the call (at 32 rows the kernel was 1.1x slower than the float32 weight's GEMM); more
  rows (a prompt) multiply in XLA's GEMM against the weight widened by the kernel, whole, or in
  blocks of rows where its float32 copy exceeds ``widened_block_bytes`` (64 MiB: every layer weight of Llama-3.2-1B whole, Llama-3.1-8B's MLP
  weights in 4 blocks, a large vocabulary's head in more). A 128-token prompt of a
  Llama-3.2-1B-shaped model, against 256-row blocks: first time to first token 2.70 -> 2.00 s
  (less to compile), warm prefill 0.96 -> 0.85 s). 2-core Zen 5 EPYC, bfloat16
  (``benchmarks/results/bfloat16_matmul_zen5_avx512.txt``, against the float32 weight widened at
  load): one row 2.2x (``[2048, 2048]``), 2.1x (``[8192, 2048]``), 1.5x (``[2048, 8192]``), 1.7x
  (the ``[128256, 2048]`` head); 4 rows 2.7-3.5x; 32 rows 0.99-1.06x; 128 rows, widened whole:
  0.40-0.91x (XLA converting the weight in the program instead: 1.26 to 16.5x slower than the
  float32 weight). A Llama-3.2-1B-shaped bfloat16 directory
  (``benchmarks/results/scale_bf16_zen5_avx512.json``, its last run and one before it): decode 8.3-9.3 -> 17.2-20.4
  tokens/s, peak RSS 5.39 -> 2.92 GB, load 2.67-3.45 -> 1.46 s (0.26 s with
  ``mapped_float_tensors``), warm time to first token of a 128-token prompt 733-771 -> 864-922
  ms, the same greedy tokens; its F16 GGUF against llama.cpp, same run: decode 1.01-1.05x, peak
  RSS 1.12x, time to first token 1.25-1.32x (``scale_f16_zen5_avx512.json``). A
  Llama-3.1-8B-shaped bfloat16 directory, refused widened (30.9 GiB against 22.9 available),
  loads in 0.27 s and decodes at 2.96 tokens/s with 15.6 GB peak RSS
  (``scale_bf16_8b_zen5_avx512.json``). CPU where the kernels build: True; others: False (the
  weights are widened at load; unmeasured).
- ``bfloat16_matmul``: whether the platform multiplies bfloat16 natively, so that
  ``Trainer(compute_dtype="bfloat16")`` is worth running. GPU and TPU: True; CPU: True only with
  bfloat16 dot instructions (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``), since XLA:CPU
  otherwise emulates bfloat16 dots through float32 conversions (slower than float32).
- ``bfloat16_float32_dots``: a bfloat16 ``x @ w.T`` of a stored weight (``matmul_t(...,
  stored=True)``: every ``Linear``) asks the dot for float32 results and rounds them to bfloat16,
  in the forward product and in both cotangent products (a ``custom_vjp``), and so does a bfloat16
  ``einsum`` (attention) in its forward product: float32 accumulation,
  and on XLA:CPU its fast bfloat16 path, where a dot with bfloat16 results takes a slow one
  (2-core AVX-512/AMX Xeon, ``[512, 576] x [576, 1536]``: float32 4.4 ms, bfloat16 with
  bfloat16 results 5.2 ms, with float32 results 1.2 ms). CPU: True; GPU and TPU: False (their
  bfloat16 dots accumulate in float32 already).
- ``bfloat16_remat``: what ``Trainer(compute_dtype="bfloat16")`` does when ``remat`` is not
  given: recompute each scanned layer in the backward pass. XLA:CPU widens a bfloat16
  ``dynamic-slice``/``dynamic-update-slice`` to float32, so a scan that stacks bfloat16 residuals
  converts the whole stack at every layer and a stacked bfloat16 weight is converted whole at
  every step; recomputing keeps one residual per layer (a LoRA step of SmolLM2, batch 4 x 128,
  2-core AVX-512/AMX Xeon: 3.5 s without, 2.5-2.8 s with). CPU: True; GPU and TPU: False.
- ``attention_kernel``: whole float32 sequences attending over their own keys and values (a
  training or scoring step's layers) run in maxjax's CPU kernel
  (:mod:`maxjax.backend.kernels.attention`, forward and backward) instead of XLA's batched
  products. SmolLM2 LoRA in bfloat16 (batch 4 x 128, 9 query over 3 KV heads, head_dim 64),
  2-core Zen 5 EPYC, three pairs of processes run alternately: 0.76-0.79 s a step against
  0.84-0.87 s (one pair in a slow window of the machine: 0.92 against 0.86); one layer's forward
  0.54 ms against 1.2-1.4 ms, forward and backward 1.73-1.79 ms against 2.45-2.50 ms).
  CPU where the kernels build, one device (a split batch or split weights: False, as the SPMD
  partitioner cannot split the kernel's custom call): True; GPU and TPU: False.
- ``bfloat16_stack_bits``: a Trainer's frozen bfloat16 weight stacks go through the layer scan as
  their uint16 bit patterns (:class:`~maxjax.graph.layer_weights.StackBits`), sliced in place,
  rather than widened to float32 whole at every step (same SmolLM2 LoRA step, with remat: 2.7 s
  -> 2.2 s; the values are bit-identical). CPU: True; GPU and TPU: False.
- ``bfloat16_autocast``: how ``Trainer(compute_dtype="bfloat16")`` runs. True: PyTorch's
  ``torch.autocast`` recipe for CPU matmuls. Activations, norms, attention and the loss stay
  float32; each stored-weight product (every ``Linear``, a tied LM head) rounds its float32
  operand to bfloat16 and multiplies the bfloat16 weight with float32 results, forward and in
  both cotangent products. The Trainer sets ``autocast`` on its program's policy for this, and
  a recomputed layer scan (``bfloat16_remat``) keeps those products' float32 results for the
  backward pass and recomputes only the rest. False: activations are bfloat16 too. CPU without
  AMX-BF16: True (a LoRA step of SmolLM2, batch 4 x 128, on a 2-core AVX-512 Zen 5 EPYC, processes
  run alternately: 494-536 -> 572-622 tokens/s, and a loss closer to float32's); CPU with
  AMX-BF16: False (its frozen products run in the AMX kernel on bfloat16 activations,
  ``bfloat16_frozen_kernel``; autocast is unmeasured there); GPU and TPU: False.
- ``autocast``: set by a bfloat16 ``Trainer`` on its own program's policy where
  ``bfloat16_autocast`` holds, never by a platform's policy. While set, a stored-weight product
  of float32 activations with a bfloat16 weight runs as above (elsewhere JAX's promotion widens
  the weight to float32), and a recomputed layer scan saves the float32 products
  (:func:`maxjax.graph.scan.run_chain`).
- ``xla_options``: compiler options for the programs maxjax itself jits (``CausalLM``'s steps,
  ``InferenceSession`` models), never for functions a user jits. CPU: XNNPACK off (its per-call
  cost exceeds small matmuls), and 512-bit vectors for float32 programs where the CPU has AVX-512.

``policy_for(platform)`` gives the policy of a platform, a ``jax.Device``, a ``maxjax.driver``
``Device`` or a ``DeviceRef`` (None: JAX's default backend). A policy is a frozen dataclass:
``dataclasses.replace(policy_for("gpu"), precision=jax.lax.Precision.HIGHEST)`` makes a variant
to pass to ``Program(..., policy=...)`` or ``load_model(..., policy=...)``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from maxjax.backend.cpu import cpu_features, native_isa
from maxjax.backend.kernels import amx as _amx

__all__ = ["BackendPolicy", "policy_for", "cpu_policy", "gpu_policy", "tpu_policy", "platform_of"]

_LAYOUTS = ("packed", "unpacked", "nibbles", "dequantized", "int8", "mapped", "tiles")
_GROUPED = ("always", "decode", "batched_decode", "never")
LAYER_WEIGHTS = ("stacked", "per_layer")
#: the ``/proc/cpuinfo`` flags of x86 bfloat16 dot instructions (AVX512_BF16: Cooper Lake, Zen 4;
#: AMX-BF16: Sapphire Rapids)
BFLOAT16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
#: the ``/proc/cpuinfo`` flags of x86 int8 dot-product instructions (vpdpbusd: AVX512_VNNI from
#: Cascade Lake and Zen 4, AVX-VNNI from Alder Lake)
INT8_DOT_CPU_FLAGS = frozenset({"avx512_vnni", "avx_vnni"})


@dataclasses.dataclass(frozen=True)
class BackendPolicy:
    """The backend choices for one platform (see the module docstring for each field).

    Args:
        platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``.
        precision: ``lax.Precision`` of float32 matmuls, or None for XLA's default.
        encoder_precision: ``precision`` of an encoder's inference program.
        frozen_precision: precision of a float32 Trainer's products with its frozen weights.
        bfloat16_frozen_kernel: a bfloat16 Trainer's frozen weights multiply in the AMX kernel.
        quantized_layout: ``"nibbles"``, ``"unpacked"``, ``"packed"``, ``"dequantized"``,
            ``"int8"`` or ``"mapped"``.
        mapped_encodings: GGUF encoding names (``"Q4_0"``, ``"Q8_0"``) read in place from the
            mapped file unless a layout is asked for (see above).
        tiled_encodings: GGUF encoding names (``"Q4_0"``, ``"Q4_1"``) that take the ``tiles`` layout where
            activations are rounded to Q8_0 (``q8_activations``) and no layout is asked for.
        weight_left_max_rows: most rows of ``x`` for which ``x @ w.T`` runs weight-left (0: off).
        dequant_row_chunk: rows per block when a large quantized weight is multiplied (0: off).
        dequant_col_chunk: columns per block when a quantized weight with long rows is multiplied
            (0: off).
        int8_min_rows: fewest input rows an ``int8``-layout weight multiplies with int8 dots (0: never).
        native_matmul_max_rows: most input rows a quantized weight multiplies in maxjax's CPU
            kernel (0: never).
        host_layout_conversion: GGUF blocks are converted to the run-time layout on the host
            where the layout allows (see above).
        arithmetic: ``"float32"`` or ``"int8"``, what ``arithmetic="auto"`` means.
        q8_activations: products with GGUF-quantized weights take their activations rounded to
            Q8_0 blocks (see above).
        release_freed_heap: a model's load, generation and serving give freed heap back to
            the system (see above).
        compile_decode_first: generation compiles the decode step before it runs the prompt
            (see above).
        grouped_attention: ``"always"``, ``"decode"``, ``"batched_decode"`` or ``"never"``.
        encoder_rows: most rows in one compiled encoder pass (at least 1).
        layer_weights: ``"stacked"`` or ``"per_layer"``, how inference programs hold the float
            matrices of scanned layers.
        keep_16bit_weights: a float32 model keeps a checkpoint's bfloat16 or float16 weights as
            they are and widens them in each product (see above).
        mapped_float_tensors: float tensors of a mapped file are adopted where they lie when the
            layout allows (see above).
        widened_kernel_max_rows: most input rows a 16-bit float weight multiplies in maxjax's
            kernel (see ``keep_16bit_weights``; 0: never).
        widened_block_bytes: most float32 bytes of a 16-bit float weight widened at once for a
            prompt's GEMM in maxjax's kernel (see ``keep_16bit_weights``).
        attention_kernel: whole-sequence float32 attention runs in maxjax's CPU kernel (see above).
        bfloat16_matmul: the platform has native bfloat16 dots (bfloat16 training is allowed).
        bfloat16_float32_dots: bfloat16 stored-weight products ask for float32 results (see above).
        bfloat16_remat: bfloat16 training recomputes scanned layers unless told otherwise (see above).
        bfloat16_stack_bits: frozen bfloat16 stacks are scanned as their bits (see above).
        bfloat16_autocast: a bfloat16 Trainer keeps float32 activations and rounds only the
            operands of stored-weight products to bfloat16 (see above).
        autocast: this program runs those products so (set by the Trainer, see above).
        xla_options: XLA compiler options for maxjax's own jitted programs.
        wide_vector_options: further options for float32 programs only (the CPU's 512-bit vectors:
            with bfloat16 activations they moved SmolLM2's logits 0.875 from transformers' own
            bfloat16 run, against 0.125 without).
        cpu_features: the host CPU's feature flags the policy was chosen from.

    Raises:
        ValueError: an unknown ``quantized_layout``, ``grouped_attention`` or ``layer_weights``,
            ``encoder_rows`` < 1, or ``mapped_encodings`` other than Q4_0 and Q8_0.
    """

    platform: str
    precision: Any = None
    encoder_precision: Any = None
    frozen_precision: Any = None
    bfloat16_frozen_kernel: bool = False
    quantized_layout: str = "unpacked"
    mapped_encodings: tuple[str, ...] = ()
    tiled_encodings: tuple[str, ...] = ()
    weight_left_max_rows: int = 0
    dequant_row_chunk: int = 0
    dequant_col_chunk: int = 0
    int8_min_rows: int = 0
    native_matmul_max_rows: int = 0
    host_layout_conversion: bool = False
    arithmetic: str = "float32"
    q8_activations: bool = False
    release_freed_heap: bool = False
    compile_decode_first: bool = False
    grouped_attention: str = "always"
    encoder_rows: int = 256
    layer_weights: str = "stacked"
    keep_16bit_weights: bool = False
    mapped_float_tensors: bool = False
    widened_block_bytes: int = 64 << 20
    widened_kernel_max_rows: int = 0
    attention_kernel: bool = False
    bfloat16_matmul: bool = True
    bfloat16_float32_dots: bool = False
    bfloat16_remat: bool = False
    bfloat16_stack_bits: bool = False
    bfloat16_autocast: bool = False
    autocast: bool = False
    xla_options: tuple[tuple[str, Any], ...] = ()
    wide_vector_options: tuple[tuple[str, Any], ...] = ()
    cpu_features: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.quantized_layout not in _LAYOUTS:
            raise ValueError(f"BackendPolicy.quantized_layout must be one of {_LAYOUTS}, got {self.quantized_layout!r}")
        if self.grouped_attention not in _GROUPED:
            raise ValueError(f"BackendPolicy.grouped_attention must be one of {_GROUPED}, got {self.grouped_attention!r}")
        if self.arithmetic not in ("float32", "int8"):
            raise ValueError(f"BackendPolicy.arithmetic must be 'float32' or 'int8', got {self.arithmetic!r}")
        if self.layer_weights not in LAYER_WEIGHTS:
            raise ValueError(f"BackendPolicy.layer_weights must be one of {LAYER_WEIGHTS}, got {self.layer_weights!r}")
        unknown = set(self.mapped_encodings) - {"Q4_0", "Q8_0"}
        if unknown:
            raise ValueError(f"BackendPolicy.mapped_encodings: maxjax reads only Q4_0 and Q8_0 in place, got {sorted(unknown)}")
        if set(self.tiled_encodings) - {"Q4_0", "Q4_1"}:
            raise ValueError(f"BackendPolicy.tiled_encodings: the tiles layout takes only Q4_0 and Q4_1, got {sorted(self.tiled_encodings)}")
        if self.encoder_rows < 1:
            raise ValueError(f"BackendPolicy.encoder_rows must be at least 1, got {self.encoder_rows}")

    # -- compiling ---------------------------------------------------------------------------
    def compiler_options(self, dtype: Any = np.float32) -> dict[str, Any] | None:
        """XLA options for a program maxjax jits whose activations are ``dtype`` (None: none)."""
        opts = dict(self.xla_options)
        if np.dtype(dtype) == np.float32:
            opts.update(self.wide_vector_options)
        if self.q8_activations and self.platform == "cpu":  # see ``q8_activations``
            opts["xla_cpu_experimental_ynn_fusion_type"] = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
        return opts or None

    # -- matmuls -----------------------------------------------------------------------------
    def matmul(self, a: Any, b: Any) -> Any:
        """``jnp.matmul(a, b)`` at this policy's precision."""
        return jnp.matmul(a, b, precision=self.precision)

    def einsum(self, spec: str, *operands: Any) -> Any:
        """``jnp.einsum`` at this policy's precision (bfloat16 operands: float32 results rounded
        to bfloat16 where ``bfloat16_float32_dots``)."""
        if self.bfloat16_float32_dots and operands and all(getattr(o, "dtype", None) == jnp.bfloat16 for o in operands):
            return jnp.einsum(spec, *operands, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
        return jnp.einsum(spec, *operands, precision=self.precision)

    def matmul_t(self, x: Any, w: Any, stored: bool = False) -> Any:
        """``x @ w.T``: ``x [..., in]``, ``w [out, in]`` -> ``[..., out]``.

        The one place the weight-side products of the linear layers and quantized weights are
        written. ``stored``: ``w`` is an array as stored (a float ``Linear``'s weight), not one
        computed in the program (a dequantized weight).

        - A computed weight with 2 to :attr:`weight_left_max_rows` rows in ``x`` runs weight-left
          (see the module docstring); results are equal up to the order of the float32 sums, which
          then depends on the number of rows. Otherwise ``jnp.matmul(x, w.T)``: for one row XLA:CPU
          fuses the dequantization and the transpose into the product (a Q4_1 SmolLM2 decodes at
          35 tokens/s so, 9 with the stored form below).
        - A stored float32 weight at ``precision=HIGH`` on the CPU runs in the AMX kernel
          where it runs (:mod:`maxjax.backend.kernels.amx`; see ``encoder_precision``), as does
          an :class:`~maxjax.backend.kernels.amx.AmxWeight` (a program at ``HIGH`` lays out the
          weights it only multiplies so, once, when its state is prepared).
        - A stored weight is contracted in its stored layout (``lax.dot_general`` over its axis 1):
          ``jnp.matmul(x, w.T)`` leaves a transpose that XLA:CPU materialises for one row (a float32
          ``[2048, 8192]`` weight times one row: 97 ms, against 3.8 ms; never slower at 32 and 128
          rows). Never weight-left, so each row's result is independent of the other rows from
          2 rows on (a sentence alone and in a padded batch give the same numbers).
        """
        if isinstance(w, _amx.AmxWeight):  # laid out for the AMX kernel when the program was prepared
            return _amx.matmul_t(x, w)
        if stored and self.autocasts(x, w):
            return _autocast_matmul_t(x, w)
        if stored and self.widens(x, w):
            return self._widened_matmul_t(x, w)
        if stored and w.ndim == 2 and x.dtype == w.dtype:
            if self.precision == lax.Precision.HIGH and self.platform == "cpu" and _amx_takes(x, w):
                return _amx.matmul_t(x, w)
            if self.bfloat16_float32_dots and x.dtype == jnp.bfloat16:
                return _bfloat16_matmul_t(self._widened_kernel(w, math.prod(x.shape[:-1])), x, w)
            return lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())), precision=self.precision)
        rows = math.prod(x.shape[:-1])  # symbolic while a Graph is built with symbolic dimensions
        n = 0 if stored else self.weight_left_max_rows
        if n and w.ndim == 2 and isinstance(rows, (int, np.integer)) and 1 < rows <= n:
            flat = x.reshape(rows, x.shape[-1])
            y = lax.dot_general(w, flat, (((1,), (1,)), ((), ())), precision=self.precision)
            return lax.optimization_barrier(y).T.reshape(*x.shape[:-1], w.shape[0])
        return jnp.matmul(x, w.T, precision=self.precision)

    def autocasts(self, x: Any, w: Any) -> bool:
        """Whether ``x @ w.T`` of a stored weight runs autocast (see ``autocast``): float32 ``x``,
        a 2-D bfloat16 ``w``, in a program whose policy has ``autocast``."""
        return self.autocast and getattr(w, "ndim", 0) == 2 and x.dtype == jnp.float32 and w.dtype == jnp.bfloat16

    def widens(self, x: Any, w: Any) -> bool:
        """Whether ``x @ w.T`` of a stored weight is a float32 product of a 16-bit float weight
        widened exactly (float32 ``x``, a 2-D bfloat16 or float16 ``w``, not :attr:`autocast`):
        the same values as the weight converted to float32 first, without converting it in
        memory where the kernel runs (see ``keep_16bit_weights``)."""
        from maxjax.backend import kernels

        return not self.autocast and getattr(w, "ndim", 0) == 2 and x.dtype == jnp.float32 and w.dtype in kernels.WIDENED_DTYPES

    def _widened_matmul_t(self, x: Any, w: Any) -> Any:
        """``x [..., in]`` float32 ``@ w [out, in].T`` bfloat16 or float16 in float32 arithmetic.
        In maxjax's CPU kernel where it runs (:func:`maxjax.backend.kernels.widened_matmul`): 1 to
        :attr:`widened_kernel_max_rows` rows read the weight in place, more rows multiply in XLA's
        GEMM against the weight widened by the kernel, in blocks of :meth:`widened_rows` rows.
        Elsewhere the weight is converted to float32 and contracted as stored."""
        from maxjax.backend import kernels

        lead = math.prod(x.shape[:-1])  # symbolic while a Graph is built with symbolic dimensions
        if self._widened_kernel(w, lead):
            return kernels.widened_matmul(x, w)
        if self._widened_kernel(w, 1) and isinstance(lead, (int, np.integer)) and lead > 0:  # more rows: a prompt
            return kernels.widened_matmul(x, w, widen_rows=self.widened_rows(int(w.shape[0]), int(w.shape[1])))
        wide = w.astype(jnp.float32)  # exact
        return lax.dot_general(x, wide, (((x.ndim - 1,), (1,)), ((), ())), precision=self.precision)

    def _widened_kernel(self, w: Any, lead: Any) -> bool:
        """Whether ``x @ w.T`` of a stored 16-bit float ``w`` with ``lead`` rows in ``x`` runs in
        maxjax's kernel product: on the CPU, 1 to :attr:`widened_kernel_max_rows` rows, a weight
        the kernel takes, a kernel that builds here."""
        from maxjax.backend import kernels

        if self.platform != "cpu" or not _rows_within(lead, self.widened_kernel_max_rows):
            return False
        return kernels.takes_widened(w) and kernels.available()

    def widened_rows(self, rows: int, cols: int) -> int:
        """Rows of a 16-bit float weight ``[rows, cols]`` widened at once for a prompt's GEMM (see
        ``widened_block_bytes``): all of them where their float32 copy fits in the block, else as
        many as fit (at least 1; the last block takes the rest)."""
        return max(1, min(rows, self.widened_block_bytes // (4 * cols)))

    def int8_dots(self, lead: Any) -> bool:
        """Whether an ``int8``-layout weight multiplies ``lead`` input rows (a known count, not a
        symbolic one) as int8 dots: at least :attr:`int8_min_rows` of them, where that is not 0."""
        n = self.int8_min_rows
        return bool(n) and isinstance(lead, (int, np.integer)) and lead >= n

    def native_matmul(self, w: Any, lead: Any) -> bool:
        """Whether ``x @ w.T`` of a quantized weight ``w`` (2-D, or a layer stack) with ``lead``
        rows in ``x`` runs in maxjax's CPU kernel (:mod:`maxjax.backend.kernels`): 1 to
        :attr:`native_matmul_max_rows` rows, a weight the kernel takes, and a kernel that builds
        here (the first call may compile it: a few seconds, once per machine)."""
        if not _rows_within(lead, self.native_matmul_max_rows):
            return False
        from maxjax.backend import kernels

        return kernels.supports(w) and kernels.available()

    def row_chunks(self, rows: int, lead: Any) -> int:
        """How many row blocks a quantized weight of ``rows`` rows is dequantized in when it
        multiplies ``lead`` input rows (1: the whole weight at once)."""
        c = self.dequant_row_chunk
        if c and isinstance(lead, (int, np.integer)) and lead > 1 and rows >= 2 * c and rows % c == 0:
            return rows // c
        return 1

    def col_chunks(self, cols: Any, lead: Any) -> int:
        """How many column blocks a quantized weight of ``cols`` columns is dequantized and
        multiplied in when it multiplies ``lead`` input rows (1: the whole row at once). Not for
        the weight-left rows (2 to ``weight_left_max_rows``), where the blocks cost 15-30% more."""
        c = self.dequant_col_chunk
        if not (c and isinstance(cols, (int, np.integer)) and cols > c and cols % c == 0):
            return 1
        if isinstance(lead, (int, np.integer)) and 1 < lead <= self.weight_left_max_rows:
            return 1
        return cols // c

    # -- attention ---------------------------------------------------------------------------
    def attends_in_kernel(self, q: Any, k: Any, v: Any) -> bool:
        """Whether causal attention of whole sequences ``q [b, s, h, d]`` over ``k``, ``v [b, s,
        kv, d]`` runs in maxjax's CPU kernel (:attr:`attention_kernel`, operands it takes, a kernel
        that builds here)."""
        if not self.attention_kernel or self.platform != "cpu":
            return False
        from maxjax.backend import kernels
        from maxjax.backend.kernels import attention

        return attention.takes(q, k, v) and kernels.available()

    def attention_grouped(self, batch: Any, seq: Any, groups: Any) -> bool:
        """Whether attention groups query heads per KV head (True) or repeats KV heads (False).

        Sizes may be symbolic while a graph infers shapes; both layouts give the same shapes.
        """
        if groups == 1 or self.grouped_attention == "never":
            return False
        if self.grouped_attention == "always":
            return True
        if self.grouped_attention == "decode":
            return seq == 1
        return seq == 1 and not batch == 1


def _rows_within(lead: Any, most: int) -> bool:
    """Whether ``lead``, an activation's row count, is known (not symbolic) and 1 to ``most``."""
    return isinstance(lead, (int, np.integer)) and 0 < lead <= most


def _amx_takes(x: Any, w: Any) -> bool:
    """Whether ``x @ w.T`` runs in the AMX kernel here (shapes it takes; a CPU and build
    that run it: the first call may build the kernels' library)."""
    return _amx.supports(x, w) and _amx.available()


def _float32_dot_t(x: Any, w: Any) -> Any:
    """``x [..., in] @ w [out, in].T`` with float32 results (sums), whatever the operands' dtype.

    Written as ``matmul(x, w.T)``, not as a ``dot_general`` over ``w``'s axis 1 (as ``matmul_t``
    contracts a stored float32 weight): with bfloat16 operands and one row XLA:CPU then widens the
    whole weight to float32 in memory before the product. One bfloat16 row times 8 bfloat16
    ``[8192, 2048]`` weights, 2-core Zen 5: 153 ms that way, 7.7 ms this way; 4 to 128 rows the
    same either way.
    """
    return jnp.matmul(x, w.T, preferred_element_type=jnp.float32)


def _float32_cotangents(g: Any, x: Any, w: Any) -> tuple[Any, Any]:
    """The cotangents of ``y = x @ w.T`` for ``g = dy`` (operands of one dtype), float32 sums and
    results: ``dx = g @ w`` ``[..., in]`` and ``dw = g.T @ x`` over every row ``[out, in]``."""
    dx = lax.dot_general(g, w, (((g.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.float32)  # [..., in]
    g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])  # [rows, out], [rows, in]
    dw = lax.dot_general(g2, x2, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)  # [out, in]
    return dx, dw


def _bfloat16_dot_t(kernel: bool, x: Any, w: Any) -> Any:
    """``x [..., in] @ w [out, in].T`` of bfloat16 operands with float32 results, rounded to
    bfloat16. ``kernel``: in maxjax's CPU kernel (``x`` widened exactly: each product of two
    bfloat16 values is exact in float32, so the arithmetic is XLA's bfloat16 dot's, sums in
    float32, at half a float32 weight's bytes; XLA:CPU's one-row bfloat16 dot read a
    Llama-3.2-1B-shaped model at 5.5 tokens/s)."""
    if kernel:
        from maxjax.backend import kernels

        return kernels.widened_matmul(x.astype(jnp.float32), w).astype(x.dtype)
    return _float32_dot_t(x, w).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _bfloat16_matmul_t(kernel: bool, x: Any, w: Any) -> Any:
    """:func:`_bfloat16_dot_t`, whose cotangent products also run bfloat16 x bfloat16 -> float32
    (JAX's own transpose of a dot keeps the forward's result dtype: bfloat16 results)."""
    return _bfloat16_dot_t(kernel, x, w)


def _bfloat16_matmul_t_fwd(kernel: bool, x: Any, w: Any) -> tuple[Any, tuple[Any, Any]]:
    return _bfloat16_dot_t(kernel, x, w), (x, w)


def _bfloat16_matmul_t_bwd(kernel: bool, res: tuple[Any, Any], g: Any) -> tuple[Any, Any]:
    x, w = res
    dx, dw = _float32_cotangents(g.astype(x.dtype), x, w)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_bfloat16_matmul_t.defvjp(_bfloat16_matmul_t_fwd, _bfloat16_matmul_t_bwd)


@jax.custom_vjp
def _autocast_matmul_t(x: Any, w: Any) -> Any:
    """``x [..., in]`` float32 ``@ w [out, in].T`` bfloat16 -> float32 ``[..., out]``: ``x`` rounded
    to bfloat16, float32 sums and results (``torch.autocast``'s CPU ``linear``); the cotangent
    products round the cotangent to bfloat16 too, ``x``'s coming back float32 and ``w``'s
    bfloat16."""
    return _float32_dot_t(x.astype(jnp.bfloat16), w)


def _autocast_matmul_t_fwd(x: Any, w: Any) -> tuple[Any, tuple[Any, Any]]:
    xb = x.astype(jnp.bfloat16)  # [..., in]
    return _float32_dot_t(xb, w), (xb, w)  # [..., out]


def _autocast_matmul_t_bwd(res: tuple[Any, Any], g: Any) -> tuple[Any, Any]:
    xb, w = res
    dx, dw = _float32_cotangents(g.astype(jnp.bfloat16), xb, w)
    return dx, dw.astype(w.dtype)  # float32 [..., in], bfloat16 [out, in]


_autocast_matmul_t.defvjp(_autocast_matmul_t_fwd, _autocast_matmul_t_bwd)


# -- the policies ------------------------------------------------------------------------------


def cpu_policy(features: frozenset[str] | None = None) -> BackendPolicy:
    """The CPU policy for a CPU with ``features`` (default: this machine's, see :func:`cpu_features`)."""
    flags = cpu_features() if features is None else frozenset(features)
    avx512 = "avx512f" in flags
    kernel = native_isa(flags) is not None  # maxjax's CPU kernel builds for this CPU
    return BackendPolicy(
        platform="cpu",
        precision=lax.Precision.HIGHEST,
        encoder_precision=lax.Precision.HIGH if _amx.AMX_FLAGS <= flags else lax.Precision.HIGHEST,
        frozen_precision=lax.Precision.HIGH if _amx.AMX_FLAGS <= flags else lax.Precision.HIGHEST,
        bfloat16_frozen_kernel=_amx.AMX_FLAGS <= flags,
        quantized_layout="nibbles" if avx512 else "unpacked",
        mapped_encodings=("Q4_0", "Q8_0") if avx512 and kernel else (),
        tiled_encodings=("Q4_0", "Q4_1") if avx512 and "avx512bw" in flags and kernel else (),
        release_freed_heap=True,
        compile_decode_first=True,
        weight_left_max_rows=16,
        dequant_row_chunk=256,
        dequant_col_chunk=0 if kernel else 2048,
        int8_min_rows=16,
        native_matmul_max_rows=32 if kernel else 0,
        host_layout_conversion=kernel,
        grouped_attention="decode" if avx512 else "batched_decode",
        encoder_rows=32,
        layer_weights="per_layer",
        keep_16bit_weights=kernel,
        widened_kernel_max_rows=16 if kernel else 0,
        attention_kernel=kernel,
        mapped_float_tensors=True,
        bfloat16_matmul=bool(flags & BFLOAT16_CPU_FLAGS),
        bfloat16_float32_dots=True,
        bfloat16_remat=True,
        bfloat16_stack_bits=True,
        bfloat16_autocast=not _amx.AMX_FLAGS <= flags,
        xla_options=(("xla_cpu_use_xnnpack", False),),
        wide_vector_options=(("xla_cpu_prefer_vector_width", 512),) if avx512 else (),
        cpu_features=flags,
    )


def gpu_policy() -> BackendPolicy:
    """The GPU policy: XLA's defaults, one byte per quantized value, grouped attention."""
    return BackendPolicy(platform="gpu")


def tpu_policy() -> BackendPolicy:
    """The TPU policy: XLA's defaults, one byte per quantized value, grouped attention."""
    return BackendPolicy(platform="tpu")


def platform_of(where: Any = None) -> str:
    """``"cpu"``, ``"gpu"`` or ``"tpu"`` for a platform name, a ``jax.Device``, a
    ``jax.sharding.Sharding``, a ``maxjax`` ``Device``/``DeviceRef`` or None (JAX's default backend).

    Raises:
        ValueError: a platform maxjax has no policy for.
    """
    if where is None:
        name = jax.default_backend()
    elif isinstance(where, str):
        name = where
    elif isinstance(where, jax.sharding.Sharding):
        name = next(iter(where.device_set)).platform
    elif hasattr(where, "platform") and isinstance(where.platform, str):  # jax.Device
        name = where.platform
    elif hasattr(where, "jax_device"):  # maxjax.driver.Device
        name = where.jax_device.platform
    elif hasattr(where, "device_type"):  # DeviceRef
        name = str(getattr(where.device_type, "value", where.device_type))
    else:
        raise ValueError(f"cannot tell the platform of {where!r}")
    name = name.lower()
    name = {"cuda": "gpu", "rocm": "gpu"}.get(name, name)
    if name not in ("cpu", "gpu", "tpu"):
        raise ValueError(f"no backend policy for platform {name!r} (maxjax has policies for cpu, gpu and tpu)")
    return name


_FACTORIES: Mapping[str, Any] = {"cpu": cpu_policy, "gpu": gpu_policy, "tpu": tpu_policy}


@functools.lru_cache(maxsize=None)
def _cached(platform: str) -> BackendPolicy:
    return _FACTORIES[platform]()


def policy_for(where: Any = None) -> BackendPolicy:
    """The policy of a platform, device or sharding (see :func:`platform_of`); None: JAX's default
    backend. The same object is returned for the same platform.

    Raises:
        ValueError: a platform maxjax has no policy for.
    """
    if isinstance(where, BackendPolicy):
        return where
    return _cached(platform_of(where))
