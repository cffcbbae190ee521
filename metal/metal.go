package metal

import (
	_ "embed"
	"errors"
)

// Priority is the metal backend's rank for tensor.Open("auto"): below
// cuda (20), above cpu (0).
const Priority = 10

// ErrUnavailable means Metal cannot be used: not a Mac, no Metal device,
// or a binary built without the metal tag and cgo.
var ErrUnavailable = errors.New("metal: unavailable")

//go:embed kernels.metal
var source string

// Source is the Metal Shading Language source of the kernels.
func Source() string { return source }

// kernelNames are the kernels of kernels.metal in the order the driver
// makes their pipelines; the kernel* constants index it.
var kernelNames = []string{
	"hp_fill", "hp_copy", "hp_add", "hp_axpy", "hp_scale", "hp_sumsq_partial",
	"hp_gather", "hp_scatter_add", "hp_swiglu", "hp_swiglu_backward", "hp_adamw", "hp_rope",
	"hp_softmax", "hp_rmsnorm", "hp_rmsnorm_backward_dx", "hp_rmsnorm_backward_dw_partial",
	"hp_rmsnorm_backward_dw_final", "hp_softmax_xent",
	"hp_attn_forward", "hp_attn_backward_q", "hp_attn_backward_kv", "hp_gemm",
}

const (
	kernelFill = iota
	kernelCopy
	kernelAdd
	kernelAxpy
	kernelScale
	kernelSumSqPartial
	kernelGather
	kernelScatterAdd
	kernelSwiGLU
	kernelSwiGLUBackward
	kernelAdamW
	kernelRoPE
	kernelSoftmax
	kernelRMSNorm
	kernelRMSNormBackwardDx
	kernelRMSNormBackwardDwPartial
	kernelRMSNormBackwardDwFinal
	kernelSoftmaxXent
	kernelAttnForward
	kernelAttnBackwardQ
	kernelAttnBackwardKV
	kernelGemm
)

// Threadgroup sizes the kernels are written for.
const (
	attnThreads = 128 // HP_ATTN_THREADS
	attnMaxDim  = 512 // HP_ATTN_MAX_DIM
	gemmThreads = 256 // HP_GEMM_THREADS
	gemmTile    = 64  // HP_GEMM_TILE
	simdWidth   = 32
)
