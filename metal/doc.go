// Package metal is the Apple-silicon tensor.Backend: Metal compute
// kernels (kernels.metal, embedded and compiled at run time with fast math
// off) dispatched through a small Objective-C bridge, one pipeline per
// kernel, on buffers in shared storage, the unified memory the CPU and
// GPU both address. GEMM is a tiled kernel of the same file. Ops are
// encoded into command buffers and run in call order; the host waits only
// where it must read or write buffer memory (Upload, Download, Sync and
// the scalar results of SumSquares and SoftmaxCrossEntropy).
//
// The package mirrors package cuda: backend.go, memory.go and ops.go hold
// the Go side of every op over a driver interface, driver_darwin.go and
// bridge.m are the Metal driver (build constraint darwin && cgo && metal),
// and kernels.metal mirrors cuda/kernels one kernel for one. Importing the
// package with the metal tag on a Mac registers "metal" (priority 10,
// below cuda and above cpu). Everywhere else a stub registers "metal" too,
// and opening it returns an error wrapping ErrUnavailable.
//
// # What is checked where
//
// Off a Mac nothing Objective-C or MSL can be compiled. There, go vet with
// GOOS=darwin checks the Go side that builds without cgo, and the build
// tag metalemu runs this package's tests with the kernels executed by
// cuda/emu, which compiles kernels.metal as C++ through a header that
// renders the MSL built-ins the file uses: a check of the kernels' logic
// and of the Go side's dispatch arguments, not of the Metal compiler or
// the bridge. On a Mac, go test -tags metal ./metal/ runs the same tests
// on the GPU.
//
// Numbers: Metal has no float64, so reductions sum in float32 and results
// differ from cpu's in the last bits; gputest holds them to 1e-5 of the
// largest element.
package metal
