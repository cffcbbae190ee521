// Package safetensors reads and writes the Hugging Face safetensors format:
// an 8-byte little-endian header length N, N bytes of JSON describing each
// tensor (dtype, shape, [begin, end) byte range relative to the data that
// follows) plus an optional "__metadata__" map of strings, then the raw
// little-endian tensor data.
//
// A stage holds only its own transformer blocks, so reading is by tensor:
// Open reads and validates the header alone, and ReadFloat32 reads one
// tensor's byte range with ReadAt. The header is untrusted input: every
// length, offset and shape is checked before anything is allocated from it.
package safetensors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
)

// Limits on a file's header. Hugging Face's reader refuses headers over
// 100 MB too; the largest real headers (thousands of tensors) are a few MB.
const (
	// MaxHeaderSize bounds the JSON header in bytes.
	MaxHeaderSize = 100 << 20
	// prefixSize is the 8-byte little-endian header length.
	prefixSize = 8
	// MetadataKey is the reserved header entry that holds string metadata.
	MetadataKey = "__metadata__"
)

// Sentinel errors; every error that wraps one also names the tensor or the
// field at fault.
var (
	// ErrMissing: the file has no tensor of the requested name.
	ErrMissing = errors.New("safetensors: tensor missing")
	// ErrShape: a tensor's shape differs from the one the caller expects.
	ErrShape = errors.New("safetensors: tensor shape mismatch")
	// ErrDType: a dtype is unknown, or cannot be read as float32.
	ErrDType = errors.New("safetensors: unsupported dtype")
	// ErrHeader: the header is malformed, truncated or hostile.
	ErrHeader = errors.New("safetensors: invalid header")
	// ErrTruncated: the file ends before a tensor's data does.
	ErrTruncated = errors.New("safetensors: file truncated")
)

// DType is a safetensors element type, spelled as in the header.
type DType string

// The dtypes of the format. Only F32, F16, BF16 and F64 can be read as
// float32; the others are parsed (so a file holding them still opens) and
// refused by ReadFloat32 with ErrDType.
const (
	BOOL    DType = "BOOL"
	U8      DType = "U8"
	I8      DType = "I8"
	F8E4M3  DType = "F8_E4M3"
	F8E5M2  DType = "F8_E5M2"
	I16     DType = "I16"
	U16     DType = "U16"
	F16     DType = "F16"
	BF16    DType = "BF16"
	I32     DType = "I32"
	U32     DType = "U32"
	F32     DType = "F32"
	I64     DType = "I64"
	U64     DType = "U64"
	F64     DType = "F64"
	invalid DType = ""
)

var dtypeSizes = map[DType]int64{
	BOOL: 1, U8: 1, I8: 1, F8E4M3: 1, F8E5M2: 1,
	I16: 2, U16: 2, F16: 2, BF16: 2,
	I32: 4, U32: 4, F32: 4,
	I64: 8, U64: 8, F64: 8,
}

// Size is the size of one element in bytes, or 0 for an unknown dtype.
func (d DType) Size() int64 { return dtypeSizes[d] }

// Float reports whether ReadFloat32 can convert this dtype.
func (d DType) Float() bool { return d == F32 || d == F16 || d == BF16 || d == F64 }

// TensorInfo describes one tensor of a file. Begin and End are byte offsets
// relative to the start of the data section, End exclusive.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int
	Begin int64
	End   int64
}

// NumElements is the product of the shape (1 for a scalar).
func (t TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// File is an open safetensors file whose header has been validated. It is
// safe for concurrent use: reads go through ReadAt.
type File struct {
	r        io.ReaderAt
	closer   io.Closer
	dataBase int64 // file offset of the data section
	tensors  map[string]TensorInfo
	metadata map[string]string
}

// Open opens path and reads and validates its header only. Tensor data is
// read later, one tensor at a time.
func Open(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	f, err := OpenReader(fh, st.Size())
	if err != nil {
		fh.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.closer = fh
	return f, nil
}

// OpenReader reads and validates the header of a safetensors file of size
// bytes behind r. A stage that fetches weights from elsewhere can pass any
// ReaderAt (for example one over a remote stream); only the header and the
// tensors asked for are ever read.
func OpenReader(r io.ReaderAt, size int64) (*File, error) {
	if size < prefixSize {
		return nil, fmt.Errorf("%w: file is %d bytes, shorter than the %d-byte length prefix", ErrHeader, size, prefixSize)
	}
	var prefix [prefixSize]byte
	if _, err := r.ReadAt(prefix[:], 0); err != nil {
		return nil, fmt.Errorf("%w: reading length prefix: %w", ErrHeader, err)
	}
	n := binary.LittleEndian.Uint64(prefix[:])
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("%w: header length %d exceeds the %d-byte limit", ErrHeader, n, MaxHeaderSize)
	}
	if int64(n) > size-prefixSize {
		return nil, fmt.Errorf("%w: header length %d exceeds the %d bytes after the prefix (truncated file?)", ErrHeader, n, size-prefixSize)
	}
	hdr := make([]byte, n)
	if _, err := r.ReadAt(hdr, prefixSize); err != nil {
		return nil, fmt.Errorf("%w: reading %d-byte header: %w", ErrHeader, n, err)
	}
	dataBase := prefixSize + int64(n)
	tensors, meta, err := ParseHeader(hdr, size-dataBase)
	if err != nil {
		return nil, err
	}
	return &File{r: r, dataBase: dataBase, tensors: tensors, metadata: meta}, nil
}

// Tensors lists the file's tensors sorted by name.
func (f *File) Tensors() []TensorInfo {
	out := make([]TensorInfo, 0, len(f.tensors))
	for _, name := range slices.Sorted(maps.Keys(f.tensors)) {
		out = append(out, f.tensors[name])
	}
	return out
}

// Info returns the description of one tensor.
func (f *File) Info(name string) (TensorInfo, bool) {
	t, ok := f.tensors[name]
	return t, ok
}

// Metadata returns a copy of the header's "__metadata__" map (empty if the
// file has none).
func (f *File) Metadata() map[string]string {
	return maps.Clone(f.metadata)
}

// Close closes the file opened by Open. It does nothing for OpenReader.
func (f *File) Close() error {
	if f.closer == nil {
		return nil
	}
	return f.closer.Close()
}

// ReadFloat32 reads tensor name into dst, converting F32, BF16, F16 or F64
// to float32. shape is the shape the caller expects; a different shape is
// an ErrShape that names the tensor and both shapes. Only the tensor's own
// byte range is read.
func (f *File) ReadFloat32(name string, shape []int, dst []float32) error {
	t, ok := f.tensors[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrMissing, name)
	}
	if !slices.Equal(t.Shape, shape) {
		return fmt.Errorf("%w: tensor %q has shape %v, want %v", ErrShape, name, t.Shape, shape)
	}
	if int64(len(dst)) != t.NumElements() {
		return fmt.Errorf("safetensors: tensor %q: destination holds %d values, tensor has %d", name, len(dst), t.NumElements())
	}
	return f.read(t, 0, dst)
}

// ReadFloat32At is ReadFloat32 for elements [off, off+len(dst)) of the
// tensor, in row-major order: a loader can bring a tensor larger than its
// host buffer in slices.
func (f *File) ReadFloat32At(name string, shape []int, off int64, dst []float32) error {
	t, ok := f.tensors[name]
	if !ok {
		return fmt.Errorf("%w: %q", ErrMissing, name)
	}
	if !slices.Equal(t.Shape, shape) {
		return fmt.Errorf("%w: tensor %q has shape %v, want %v", ErrShape, name, t.Shape, shape)
	}
	if off < 0 || off+int64(len(dst)) > t.NumElements() {
		return fmt.Errorf("safetensors: tensor %q: elements [%d,%d) outside its %d", name, off, off+int64(len(dst)), t.NumElements())
	}
	return f.read(t, off, dst)
}

// ReadTensor reads tensor name at whatever shape the file gives it. Loaders
// that know the shape they need should use ReadFloat32, which checks it.
func (f *File) ReadTensor(name string) (Tensor, error) {
	t, ok := f.tensors[name]
	if !ok {
		return Tensor{}, fmt.Errorf("%w: %q", ErrMissing, name)
	}
	if !t.DType.Float() {
		return Tensor{}, fmt.Errorf("%w: tensor %q is %s, not a float type", ErrDType, name, t.DType)
	}
	// The header check bounded End-Begin by the file size, so this
	// allocation is at most twice the file's size (BF16 to float32).
	dst := make([]float32, t.NumElements())
	if err := f.read(t, 0, dst); err != nil {
		return Tensor{}, err
	}
	return Tensor{Name: name, Shape: slices.Clone(t.Shape), Data: dst}, nil
}

// readChunk bounds the scratch buffer of a conversion, so reading a large
// BF16 tensor costs its float32 destination and 1 MiB, not a second copy.
const readChunk = 1 << 20

// read fills dst with the tensor's elements from first on.
func (f *File) read(t TensorInfo, first int64, dst []float32) error {
	if !t.DType.Float() {
		return fmt.Errorf("%w: tensor %q is %s; only F32, F16, BF16 and F64 convert to float32", ErrDType, t.Name, t.DType)
	}
	size := t.DType.Size()
	perChunk := readChunk / size
	buf := make([]byte, min(int64(len(dst))*size, perChunk*size))
	for done := int64(0); done < int64(len(dst)); {
		n := min(int64(len(dst))-done, perChunk)
		b := buf[:n*size]
		off := f.dataBase + t.Begin + (first+done)*size
		if _, err := f.r.ReadAt(b, off); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return fmt.Errorf("%w: tensor %q: data ends before byte %d", ErrTruncated, t.Name, off+int64(len(b)))
			}
			return fmt.Errorf("safetensors: reading tensor %q: %w", t.Name, err)
		}
		decode(t.DType, b, dst[done:done+n])
		done += n
	}
	return nil
}

// Tensor is a named float32 tensor to write.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
}

func (t Tensor) String() string {
	return fmt.Sprintf("%s%v", t.Name, t.Shape)
}

// checkName refuses names that cannot round-trip through a header.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("empty tensor name")
	case name == MetadataKey:
		return fmt.Errorf("tensor name %q is reserved", name)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("tensor name %q contains NUL", name)
	}
	return nil
}
