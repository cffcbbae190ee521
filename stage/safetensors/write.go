package safetensors

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// WriteOption configures Write.
type WriteOption func(*writeConfig) error

type writeConfig struct {
	dtype    DType
	dtypeSet bool
}

// WithDType stores every tensor as dt: F32 (the default), BF16 or F16.
// BF16 and F16 round to nearest, ties to even.
func WithDType(dt DType) WriteOption {
	return func(c *writeConfig) error {
		if c.dtypeSet {
			return errors.New("safetensors: WithDType given twice")
		}
		if dt != F32 && dt != BF16 && dt != F16 {
			return fmt.Errorf("%w: cannot write %q (F32, BF16 or F16)", ErrDType, dt)
		}
		c.dtype, c.dtypeSet = dt, true
		return nil
	}
}

type writeEntry struct {
	DType       DType    `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// Write stores tensors and metadata at path in the safetensors format,
// float32 unless WithDType says otherwise. Tensors are laid out in name
// order and the header is padded with spaces so the data starts 8-byte
// aligned, as Hugging Face's writer does. The file appears atomically: it
// is written to a temporary file in the same directory, synced, then
// renamed over path. The file is created mode 0600: weights are private.
func Write(path string, tensors []Tensor, metadata map[string]string, opts ...WriteOption) error {
	return writeAtomic(path, func(w *bufio.Writer) error { return Encode(w, tensors, metadata, opts...) })
}

// WriteSources is Write for sources read on demand (EncodeSources): a
// file larger than memory can be written.
func WriteSources(path string, tensors []Source, metadata map[string]string, opts ...WriteOption) error {
	return writeAtomic(path, func(w *bufio.Writer) error { return EncodeSources(w, tensors, metadata, opts...) })
}

// Encode writes tensors and metadata to w in the safetensors format, laid
// out as Write lays out a file.
func Encode(w io.Writer, tensors []Tensor, metadata map[string]string, opts ...WriteOption) error {
	srcs := make([]Source, len(tensors))
	for i, t := range tensors {
		srcs[i] = Source{Name: t.Name, Shape: t.Shape, Data: t.Data}
	}
	return EncodeSources(w, srcs, metadata, opts...)
}

// Source is a tensor to encode: its values are in Data, or, when Data is
// nil, Read fills a buffer of its length at the moment the encoder
// reaches it. A stage's weights stream from a checkpoint file to a socket
// this way, one tensor on the host at a time.
type Source struct {
	Name  string
	Shape []int
	Data  []float32
	Read  func(dst []float32) error
}

// Encoded is a checked, laid-out list of sources: its Size is known before
// a byte is written, so a stream can announce it.
type Encoded struct {
	sorted []Source
	header []byte
	dtype  DType
}

// Layout checks names and shapes and lays out the header.
func Layout(tensors []Source, metadata map[string]string, opts ...WriteOption) (*Encoded, error) {
	cfg := writeConfig{dtype: F32}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	sorted, err := checkTensors(tensors)
	if err != nil {
		return nil, err
	}
	hdr, err := buildHeader(sorted, metadata, cfg.dtype)
	if err != nil {
		return nil, err
	}
	return &Encoded{sorted: sorted, header: hdr, dtype: cfg.dtype}, nil
}

// Size is the number of bytes WriteTo writes.
func (e *Encoded) Size() int64 {
	n := int64(prefixSize + len(e.header))
	for _, t := range e.sorted {
		n += numel(t.Shape) * e.dtype.Size()
	}
	return n
}

// WriteTo writes the file: prefix, header, then each tensor in name order,
// converted in bounded chunks.
func (e *Encoded) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: w}
	var prefix [prefixSize]byte
	binary.LittleEndian.PutUint64(prefix[:], uint64(len(e.header)))
	if _, err := cw.Write(prefix[:]); err != nil {
		return cw.n, err
	}
	if _, err := cw.Write(e.header); err != nil {
		return cw.n, err
	}
	size := int(e.dtype.Size())
	buf := make([]byte, readChunk)
	per := readChunk / size
	for _, t := range e.sorted {
		data := t.Data
		if data == nil && numel(t.Shape) > 0 {
			data = make([]float32, numel(t.Shape))
			if err := t.Read(data); err != nil {
				return cw.n, fmt.Errorf("safetensors: %s: %w", t.Name, err)
			}
		}
		for i := 0; i < len(data); i += per {
			chunk := data[i:min(i+per, len(data))]
			b := buf[:len(chunk)*size]
			encode(e.dtype, chunk, b)
			if _, err := cw.Write(b); err != nil {
				return cw.n, err
			}
		}
	}
	return cw.n, nil
}

// EncodeSources writes sources and metadata to w (Layout, then WriteTo).
func EncodeSources(w io.Writer, tensors []Source, metadata map[string]string, opts ...WriteOption) error {
	e, err := Layout(tensors, metadata, opts...)
	if err != nil {
		return err
	}
	_, err = e.WriteTo(w)
	return err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func numel(shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}

// checkTensors validates names, shapes and data lengths and returns the
// tensors sorted by name.
func checkTensors(tensors []Source) ([]Source, error) {
	sorted := slices.Clone(tensors)
	slices.SortFunc(sorted, func(a, b Source) int { return cmp.Compare(a.Name, b.Name) })
	for i, t := range sorted {
		if err := checkName(t.Name); err != nil {
			return nil, fmt.Errorf("safetensors: write: %w", err)
		}
		if i > 0 && sorted[i-1].Name == t.Name {
			return nil, fmt.Errorf("safetensors: write: tensor %q given twice", t.Name)
		}
		n := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("safetensors: write: tensor %q: negative dimension in shape %v", t.Name, t.Shape)
			}
			if d != 0 && n > math.MaxInt64/16/int64(d) {
				return nil, fmt.Errorf("safetensors: write: tensor %q: shape %v overflows", t.Name, t.Shape)
			}
			n *= int64(d)
		}
		switch {
		case t.Data == nil && t.Read == nil && n > 0:
			return nil, fmt.Errorf("safetensors: write: tensor %q has neither data nor a reader", t.Name)
		case t.Data != nil && int64(len(t.Data)) != n:
			return nil, fmt.Errorf("safetensors: write: tensor %q: shape %v holds %d values, data has %d", t.Name, t.Shape, n, len(t.Data))
		}
	}
	return sorted, nil
}

func buildHeader(sorted []Source, metadata map[string]string, dt DType) ([]byte, error) {
	entries := make(map[string]any, len(sorted)+1)
	if len(metadata) > 0 {
		entries[MetadataKey] = metadata
	}
	var off int64
	for _, t := range sorted {
		n := numel(t.Shape) * dt.Size()
		shape := t.Shape
		if shape == nil {
			shape = []int{} // a scalar is "shape": [], never null
		}
		entries[t.Name] = writeEntry{DType: dt, Shape: shape, DataOffsets: [2]int64{off, off + n}}
		off += n
	}
	hdr, err := json.Marshal(entries)
	if err != nil {
		return nil, fmt.Errorf("safetensors: write: encoding header: %w", err)
	}
	if pad := (prefixSize + len(hdr)) % 8; pad != 0 {
		hdr = append(hdr, "        "[:8-pad]...)
	}
	if len(hdr) > MaxHeaderSize {
		return nil, fmt.Errorf("safetensors: write: header of %d bytes exceeds the %d-byte limit", len(hdr), MaxHeaderSize)
	}
	return hdr, nil
}

// writeAtomic writes through fill into a temporary file beside path, syncs
// it and renames it over path, so a crash leaves either the old file or
// the new one, never half of one.
func writeAtomic(path string, fill func(*bufio.Writer) error) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("safetensors: write: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	w := bufio.NewWriterSize(tmp, 1<<20)
	if err := fill(w); err != nil {
		return fmt.Errorf("safetensors: write %s: %w", path, err)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("safetensors: write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("safetensors: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("safetensors: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("safetensors: write: %w", err)
	}
	// Make the rename itself durable; not every platform can sync a
	// directory, and the file is complete either way.
	if d, derr := os.Open(dir); derr == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
