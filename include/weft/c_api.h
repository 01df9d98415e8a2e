/* weft's C API: a plain C ABI over the runtime and the ops, for language bindings (the Python
 * package reaches it through ctypes, so one build serves every Python and PyTorch version).
 * Library: libweft_c.so (target weft::weft_c).
 *
 * Conventions:
 *  - Every function returns WEFT_OK (0) or an error code; weft_last_error() then holds the
 *    message (per thread, valid until this thread's next call into the API).
 *  - Pointers are this rank's memory: device memory on the nccl backend, host memory on the
 *    host backend. `stream` is a cudaStream_t on the nccl backend (NULL: the legacy default
 *    stream), ignored on the host backend. Work is enqueued on `stream`; the host backend's
 *    calls are complete on return.
 *  - dtype: WEFT_F32, WEFT_F16, WEFT_BF16. method: a method's name ("auto" or NULL for auto).
 *  - Calls marked "collective" must be made by every rank of the world, in the same order with
 *    the same arguments (where an argument must agree, a disagreement is an error naming both
 *    values). Objects are not thread-safe: one thread at a time per world and its ops.
 *  - Nothing here allocates or synchronises during CUDA-graph capture except where it says
 *    so: the first call of a shape (which allocates symmetric state) is refused while
 *    `stream` is capturing, with a message saying to make one call eagerly first.
 */
#ifndef WEFT_C_API_H
#define WEFT_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WEFT_C_API_VERSION 1

enum weft_status {
  WEFT_OK = 0,
  WEFT_EINVAL = 1,   /* invalid argument, disagreeing ranks, a buffer too small */
  WEFT_ETIMEOUT = 2, /* a wait passed WEFT_TIMEOUT_MS: a peer did not arrive (the message names it) */
  WEFT_EFAIL = 3     /* anything else (CUDA, NCCL, system errors) */
};

enum weft_dtype { WEFT_F32 = 0, WEFT_F16 = 1, WEFT_BF16 = 2 };
enum weft_backend_kind { WEFT_BACKEND_HOST = 0, WEFT_BACKEND_NCCL = 1 };

const char* weft_last_error(void);
int weft_api_version(void);      /* WEFT_C_API_VERSION of the library */
const char* weft_version(void);  /* the project's version, e.g. "0.1.0" */
int weft_has_cuda(void);         /* 1 when built with the nccl backend */

/* ---- World: the ranks, their bootstrap, the backend and its symmetric heap --------------- */

/* The caller's exchange (e.g. a torch.distributed store): every rank of the world contributes
 * `bytes` bytes from `in`; `out` receives world_size * bytes, rank-major. Called from the
 * thread that called into the API, with the same sequence of sizes on every rank. Returns 0,
 * or non-zero with a message in err (at most errlen bytes, NUL-terminated); `timed_out` set to
 * 1 means a peer did not arrive in time (then `missing_rank` names it, or -1). */
typedef int (*weft_allgather_fn)(void* user, const void* in, size_t bytes, void* out, int* timed_out,
                                 int* missing_rank, char* err, size_t errlen);

typedef struct weft_world_options {
  int rank, size;             /* this rank in the world, and the world's size */
  int local_rank, local_size; /* on this node (local_size 0: the same as size) */
  int device;                 /* CUDA device for the nccl backend (-1: the current device) */
  const char* backend;        /* "host", "nccl", "auto" (nccl where GPUs and CUDA are), or NULL/""
                                 (WEFT_BACKEND of the environment, else auto) */
  weft_allgather_fn allgather; /* the bootstrap; NULL: weft's own, from the environment (a world
                                  of one needs none; more: WEFT_BOOTSTRAP_DIR or torchrun's) */
  void* user;                 /* passed to allgather */
  int64_t heap_mib;           /* the symmetric heap per rank, MiB (0: WEFT_GPU_HEAP_MIB / WEFT_HOST_HEAP_MIB) */
  int64_t timeout_ms;         /* the deadline of every wait (0: WEFT_TIMEOUT_MS) */
} weft_world_options;

typedef struct weft_world weft_world;

/* Collective: builds the bootstrap (or wraps opt->allgather), the backend and its heap.
 * Several worlds may live in one process (e.g. a tensor-parallel group and another group). */
int weft_world_create(const weft_world_options* opt, weft_world** out);
/* Local. Destroy a world's ops first. */
int weft_world_destroy(weft_world* w);
int weft_world_info(const weft_world* w, int* rank, int* size, int* backend_kind);
/* This rank's outstanding device work on every stream is done (raises a peer's timeout). */
int weft_world_synchronize(weft_world* w);
int weft_world_barrier(weft_world* w); /* collective, host-side */

/* ---- Symmetric memory ------------------------------------------------------------------ */

/* Collective: `bytes` of every rank's heap at the same offset. *handle identifies the block
 * for weft_free; *ptr is this rank's address of it (device pointer on nccl). Zeroed. */
int weft_alloc(weft_world* w, uint64_t bytes, uint64_t* handle, uint64_t* offset, void** ptr);
/* Local (every rank frees the same blocks in the same order, as it allocated them). Waits for
 * this rank's outstanding device work first (the block's last use). */
int weft_free(weft_world* w, uint64_t handle);
/* capacity: the heap's bytes per rank; used: bytes of its live blocks (ops' state included). */
int weft_heap_info(const weft_world* w, uint64_t* capacity, uint64_t* used);
/* *offset = ptr's offset in this rank's heap when [ptr, ptr + bytes) lies in it (returns 1),
 * else 0. */
int weft_heap_contains(const weft_world* w, const void* ptr, uint64_t bytes, uint64_t* offset);

/* ---- Collectives (sum; f32, f16, bf16) --------------------------------------------------
 * Outputs may be any memory: a symmetric output (in the heap) is written in place, any other
 * is staged through a symmetric workspace of the call's shape and copied out (one device
 * copy more: docs/python.md). Methods as ops::Collectives' ("baseline", "one-shot",
 * "two-shot", "ll", "ll128", "direct", "auto").
 * Staging: the first call of each (collective, count, dtype) (or weft_coll_prepare) is
 * collective: the ranks exchange whether their outputs lie outside the heap, and when any
 * does, every rank allocates the staging. A later call of that shape with an output outside
 * the heap, where the first had none, is refused (WEFT_EINVAL): prepare the shape first, or
 * keep one shape's outputs either symmetric or not. The baseline of all_gather / all_to_all
 * writes any memory directly (no staging).
 * count 0 is a no-op (pointers may then be NULL); still a collective call. */
typedef struct weft_coll weft_coll;
int weft_coll_create(weft_world* w, weft_coll** out);
int weft_coll_destroy(weft_coll* c);
/* out[count] = sum over ranks of in[count]; in == out allowed. */
int weft_all_reduce(weft_coll* c, const void* in, void* out, uint64_t count, int dtype, const char* method,
                    void* stream);
/* out[world][count] = every rank's in[count]. */
int weft_all_gather(weft_coll* c, const void* in, void* out, uint64_t count, int dtype, const char* method,
                    void* stream);
/* in[world][count]; out[count] = sum over ranks of their in[rank]. */
int weft_reduce_scatter(weft_coll* c, const void* in, void* out, uint64_t count, int dtype, const char* method,
                        void* stream);
/* in[world][count]: block p goes to rank p; out[world][count] receives block `rank` of every rank. */
int weft_all_to_all(weft_coll* c, const void* in, void* out, uint64_t count, int dtype, const char* method,
                    void* stream);
/* By counts: in packed by destination (send_counts[p] elements for rank p); out (out_capacity
 * elements) receives the blocks packed by source; recv_counts[s] = what rank s sent here.
 * send_counts / recv_counts: world-long uint64 arrays in the backend's memory (device memory
 * on nccl), so counts may change every call without the host. A call in which any rank would
 * receive more than out_capacity is refused on every rank (WEFT_EINVAL). */
int weft_all_to_all_v(weft_coll* c, const void* in, const uint64_t* send_counts, void* out, uint64_t out_capacity,
                      uint64_t* recv_counts, int dtype, const char* method, void* stream);
/* Collective: allocates what a later call of this collective ("all_reduce", "all_gather",
 * "reduce_scatter", "all_to_all", "all_to_all_v": count = out_capacity) of this shape will use
 * (its symmetric state, the output staging), so that the call can be captured in a CUDA graph. */
int weft_coll_prepare(weft_coll* c, const char* collective, uint64_t count, int dtype, const char* method);

/* ---- GEMM + communication (ops::GemmOverlap) -------------------------------------------
 * ag_gemm: C[M, N] = allgather(A[M/world, K]) · B; gemm_rs: C[M/world, N] = reduce_scatter(
 * A[M, K/world] · B); gemm_ar: C[M, N] = allreduce(A[M, K/world] · B). B is [N, K_local]
 * ("nk", torch.nn.functional.linear's weight layout) or [K_local, N] ("kn"). */
typedef struct weft_gemm_config {
  const char* op;       /* "ag_gemm", "gemm_rs", "gemm_ar" */
  int64_t m, n, k;      /* the global problem: M rows (all ranks), N columns, K the full depth */
  int dtype;            /* WEFT_BF16 or WEFT_F16 */
  const char* b_layout; /* "nk" (NULL) or "kn" */
  int chunks;           /* decomposed's chunks per shard (0: auto) */
  const int64_t* m_buckets; /* further Ms a call may have (each prepared at creation), or NULL */
  int n_m_buckets;
} weft_gemm_config;

typedef struct weft_gemm weft_gemm;
/* Collective (allocates, agrees the configuration across ranks). */
int weft_gemm_create(weft_world* w, const weft_gemm_config* cfg, weft_gemm** out);
int weft_gemm_destroy(weft_gemm* g);
/* Collective: one call with M rows (0: the configured M; a bucket's M). */
int weft_gemm_run(weft_gemm* g, const void* a, const void* b, void* c, int64_t m, const char* method, void* stream);
/* ag_gemm: weft_gemm_run that also leaves the call's gathered A [M, K] (every rank's rows) in
 * gathered_a, for a weight gradient without gathering again (GemmRunOptions::gathered_a). */
int weft_gemm_run_gathered(weft_gemm* g, const void* a, const void* b, void* c, int64_t m, const char* method,
                           void* stream, void* gathered_a);
/* The operands' shapes of a call with M rows (0: the configured M). */
int weft_gemm_shapes(const weft_gemm* g, int64_t m, int64_t* a_rows, int64_t* a_cols, int64_t* b_rows, int64_t* b_cols,
                     int64_t* c_rows, int64_t* c_cols);
/* What `auto` runs for M rows: the method's name (static storage). */
int weft_gemm_auto_method(const weft_gemm* g, int64_t m, const char** method);

/* ---- GEMV + AllReduce for decode (ops::GemvAllReduce, docs/gemv_ar.md) ------------------
 * y[M, N] = sum over ranks of x[M, K/world] · w[N, K/world]ᵀ (w in torch.nn.functional.linear's
 * layout), bf16 or f16, M = 1 ... m_max tokens per call from one object (nothing allocated
 * after creation: every call may be captured in a CUDA graph). With the epilogue:
 * residual_out = y + residual, and the call's y receives RMSNorm(residual_out) · gamma. */
typedef struct weft_gemv_config {
  int64_t n, k;   /* N output features; K the full depth (K/world per rank, a multiple of 8) */
  int64_t m_max;  /* the most tokens a call may have, 1 ... 128 (0: 128) */
  int dtype;      /* WEFT_BF16 or WEFT_F16 */
  int epilogue;   /* non-zero: the residual add + RMSNorm epilogue */
  float eps;      /* RMSNorm's epsilon (epilogue; 0: 1e-6) */
} weft_gemv_config;

typedef struct weft_gemv weft_gemv;
/* Collective (allocates the receive slots for m_max, agrees the configuration across ranks). */
int weft_gemv_create(weft_world* w, const weft_gemv_config* cfg, weft_gemv** out);
int weft_gemv_destroy(weft_gemv* g);
/* Collective: one call with M tokens (0: m_max); method "auto" (or NULL), "baseline",
 * "decomposed", "fused". x [M, K/world], w [N, K/world], y [M, N], each 16-byte aligned. The
 * epilogue's residual [M, N] (may equal residual_out), gamma [N] and residual_out [M, N] are
 * required with the epilogue and must be NULL without it. */
int weft_gemv_run(weft_gemv* g, const void* x, const void* w, void* y, int64_t m, const char* method,
                  const void* residual, const void* gamma, void* residual_out, void* stream);
/* What `auto` runs for M tokens (0: m_max): the method's name (static storage). */
int weft_gemv_auto_method(const weft_gemv* g, int64_t m, const char** method);

/* ---- MoE token exchange (ops::MoeDispatchCombine, docs/moe.md) --------------------------
 * dispatch: x [T, hidden] and ids [T, top_k] (int32 global expert ids) -> this rank's recv
 * [recv_capacity, hidden] in the backend's memory (rank-major, expert-grouped) and recv_counts
 * [world][experts / world] (int64); combine: expert_out (recv's layout) and weights [T, top_k]
 * (fp32) -> y [T, hidden], each token's rows summed with its weights in slot order. */
typedef struct weft_moe_config {
  int64_t hidden;        /* elements a row, a multiple of 8 */
  int64_t experts;       /* a multiple of the world size */
  int64_t top_k;         /* 1 ... min(8, experts) */
  int64_t max_tokens;    /* T a rank may have per call */
  int64_t recv_capacity; /* rows a rank may receive (0: for any routing) */
  int dtype;             /* WEFT_BF16, WEFT_F16 or WEFT_F32 */
  int check_ids;         /* non-zero: eager GPU dispatches read back an invalid id or a refused routing */
} weft_moe_config;

typedef struct weft_moe weft_moe;
/* Collective (allocates the symmetric buffers, agrees the configuration across ranks). */
int weft_moe_create(weft_world* w, const weft_moe_config* cfg, weft_moe** out);
int weft_moe_destroy(weft_moe* m);
/* Collective. tokens: T of this call (0 ... max_tokens; -1: max_tokens). method "auto" (or
 * NULL), "baseline", "decomposed", "direct"; combine takes its dispatch's T and method. */
int weft_moe_dispatch(weft_moe* m, const void* x, const int32_t* ids, int64_t tokens, const char* method,
                      void* stream);
int weft_moe_combine(weft_moe* m, const void* expert_out, const float* weights, void* y, int64_t tokens,
                     const char* method, void* stream);
/* The op's receive buffer and chunk counts (valid after a dispatch, until the next), its
 * recv_capacity and experts per rank. Any pointer may be NULL. */
int weft_moe_buffers(const weft_moe* m, const void** recv, const int64_t** recv_counts, int64_t* recv_capacity,
                     int64_t* local_experts);

/* ---- MoE layer (ops::MoeLayer, docs/moe.md "Layer") ---------------------------------------
 * dispatch -> each local expert's FFN (h = x W_up[e]^T, a = silu(h[:, :ffn]) * h[:, ffn:],
 * out = a W_down[e]^T) -> combine. w_up [experts / world, 2 ffn, hidden], w_down
 * [experts / world, hidden, ffn]: this rank's experts; weights [T, top_k] fp32; y [T, hidden].
 * The exchange's configuration as weft_moe's; GPUs take bf16 or f16. */
typedef struct weft_moe_layer weft_moe_layer;
/* Collective. ffn: a multiple of 8. */
int weft_moe_layer_create(weft_world* w, const weft_moe_config* cfg, int64_t ffn, weft_moe_layer** out);
int weft_moe_layer_destroy(weft_moe_layer* m);
/* Collective. tokens: T (0 ... max_tokens; -1: max_tokens); method "auto" (or NULL),
 * "baseline", "decomposed". */
int weft_moe_layer_forward(weft_moe_layer* m, const void* x, const int32_t* ids, const float* weights,
                           const void* w_up, const void* w_down, void* y, int64_t tokens, const char* method,
                           void* stream);

/* ---- Embedding-bag lookups + all-to-all (ops::EmbeddingA2A, docs/embedding_a2a.md) --------
 * Recommendation models' sparse features: the tables are sharded across ranks (each rank holds
 * whole tables, maybe none), the samples are not (rank p owns samples p * batch ... (p + 1) *
 * batch - 1 of the global batch of world * batch). forward: each of this rank's tables' bags
 * for the whole global batch (offsets and indices as nn.EmbeddingBag takes them) -> out
 * [batch, total_dim] on every rank: its own samples' pooled rows for every table of every rank,
 * the tables in global order (rank 0's, then rank 1's, ...), each table's dim columns. A bag's
 * pooled row: the sum over its indices, in index order in fp32, of weight * row (weight 1
 * without per-sample weights), rounded once to out_dtype; "mean" divides the sum by the bag's
 * size first; an empty bag pools to zeros. */
typedef struct weft_embedding_a2a_config {
  int64_t n_tables;    /* this rank's tables (0: none; the rank still takes part) */
  const int64_t* rows; /* [n_tables]: each table's rows (>= 1) */
  const int64_t* dims; /* [n_tables]: each table's columns, a multiple of 8 in 8 ... 1024 */
  int64_t batch;       /* samples each rank owns (>= 0) */
  int weight_dtype;    /* WEFT_F32, WEFT_BF16 or WEFT_F16: alike on every rank, tables or not */
  int out_dtype;       /* WEFT_F32 or WEFT_BF16 */
  const char* pooling; /* "sum" (NULL) or "mean" */
  int check_indices;   /* non-zero: eager GPU forwards read back an index outside its table (a
                          host synchronisation); the host backend always checks */
} weft_embedding_a2a_config;

/* One of this rank's tables' inputs, for the global batch (world * batch bags). */
typedef struct weft_embedding_bag {
  const void* weight;              /* [rows, dim] in weight_dtype */
  const int64_t* offsets;          /* [world * batch + 1]: bag b is indices[offsets[b] .. offsets[b + 1]) */
  const int64_t* indices;          /* [offsets[world * batch]] rows of the table (NULL when none) */
  const float* per_sample_weights; /* one per index, or NULL */
  int64_t num_indices;             /* the indices' count (offsets[world * batch]); a negative value: not given.
                                      Backward on GPUs needs it; where given it is checked. A zero-initialised
                                      struct says 0: set it, or -1 */
} weft_embedding_bag;

typedef struct weft_embedding_a2a weft_embedding_a2a;
/* Collective (agrees batch, dtypes and pooling across ranks, exchanges the tables' dims). */
int weft_embedding_a2a_create(weft_world* w, const weft_embedding_a2a_config* cfg, weft_embedding_a2a** out);
int weft_embedding_a2a_destroy(weft_embedding_a2a* e);
/* Collective. tables: [n_tables] (NULL with none); out [batch, total_dim] in out_dtype; method
 * "auto" (or NULL), "baseline", "decomposed", "fused" (the host backend runs each as the
 * baseline). A bad call on any rank (offsets not starting at 0 or decreasing, an index outside
 * its table -- the message names the table, its global number and the position --, null
 * pointers) is refused on every rank (WEFT_EINVAL). */
int weft_embedding_a2a_forward(weft_embedding_a2a* e, const weft_embedding_bag* tables, void* out, const char* method,
                               void* stream);
/* One of this rank's tables' gradient sink: the fields its kind uses (the others are ignored).
 * A row's gradient g (fp32): the sum, in fp32 from 0, over every bag of the global batch in order
 * and each of its indices i in order that names the row, of (w_i * s) * the bag's pooled gradient
 * (w_i the per-sample weight or 1; s 1, or 1 / the bag's size for mean), each product and sum
 * rounded. */
typedef struct weft_embedding_grad {
  float* dense;   /* "dense": [rows, dim], set (the rows no bag indexes: zeros) */
  int64_t* rows;  /* "sparse": [n] the distinct rows the bags index, ascending (n <= the table's indices) */
  float* values;  /* "sparse": [n, dim] their gradients */
  int64_t* count; /* "sparse": n (one int64, in this rank's memory: device memory on the nccl backend) */
  void* weight;   /* "sgd", "adagrad": [rows, dim] in weight_dtype, updated in place (usually the table's
                     weight); only the rows the bags index: sgd w = w - lr * g; adagrad (torch.optim.Adagrad's
                     sparse step) state = state + g * g, w = w + (-lr) * (g / (sqrt(state) + eps)); in fp32,
                     each operation rounded, w rounded once to weight_dtype */
  float* state;   /* "adagrad": [rows, dim], the sum of squares, updated in place */
} weft_embedding_grad;

/* Collective. The transpose of forward: grad_out [batch, total_dim] in out_dtype (the gradient of
 * forward's out on this rank) -> each of this rank's tables' gradient, into grads[t] as kind
 * says: "dense" (or NULL), "sparse", "sgd", "adagrad". tables: forward's inputs (num_indices
 * needed on the nccl backend); lr: sgd's and adagrad's learning rate (finite); eps: adagrad's
 * (finite, >= 0; torch.optim.Adagrad's default 1e-10). method as forward's. Refused on every rank
 * (WEFT_EINVAL) as forward, and for a sink's null or misaligned pointers, a dense gradient
 * overlapping a weight, a num_indices that disagrees with the offsets; an unknown kind. */
int weft_embedding_a2a_backward(weft_embedding_a2a* e, const weft_embedding_bag* tables, const void* grad_out,
                                const weft_embedding_grad* grads, const char* kind, float lr, float eps,
                                const char* method, void* stream);
/* out's layout: total_dim (its columns), every rank's tables' dims in global order (*dims: n_dims
 * values, valid while the op lives), where this rank's first table is in that order, and
 * local_dim (the sum of this rank's dims). Any pointer may be NULL. */
int weft_embedding_a2a_layout(const weft_embedding_a2a* e, int64_t* total_dim, const int64_t** dims, int64_t* n_dims,
                              int64_t* first_table, int64_t* local_dim);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_C_API_H */
