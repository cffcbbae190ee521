package safetensors

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// headerEntry is one tensor's JSON description. Pointers tell a missing
// field from a zero one.
type headerEntry struct {
	DType       *string   `json:"dtype"`
	Shape       *[]int64  `json:"shape"`
	DataOffsets *[]uint64 `json:"data_offsets"`
}

// ParseHeader validates a JSON header for a data section of dataSize bytes
// and returns its tensors by name and its metadata. It checks, before any
// allocation sized by the header: valid UTF-8 and JSON, one object with no
// duplicate names, only spaces after it; per tensor a non-empty name, a
// known dtype, non-negative dims whose product does not overflow, offsets
// with begin <= end <= dataSize and end-begin equal to the element count
// times the dtype size; no two tensors' bytes overlap; metadata values are
// strings.
func ParseHeader(hdr []byte, dataSize int64) (map[string]TensorInfo, map[string]string, error) {
	if dataSize < 0 {
		return nil, nil, fmt.Errorf("%w: negative data size %d", ErrHeader, dataSize)
	}
	if len(hdr) > MaxHeaderSize {
		return nil, nil, fmt.Errorf("%w: header length %d exceeds the %d-byte limit", ErrHeader, len(hdr), MaxHeaderSize)
	}
	if !utf8.Valid(hdr) {
		return nil, nil, fmt.Errorf("%w: header is not valid UTF-8", ErrHeader)
	}
	dec := json.NewDecoder(bytes.NewReader(hdr))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrHeader, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, fmt.Errorf("%w: header is not a JSON object", ErrHeader)
	}
	tensors := make(map[string]TensorInfo)
	var meta map[string]string
	seenMeta := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", ErrHeader, err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, nil, fmt.Errorf("%w: unexpected %v where a tensor name belongs", ErrHeader, tok)
		}
		if _, dup := tensors[name]; dup || (name == MetadataKey && seenMeta) {
			return nil, nil, fmt.Errorf("%w: %q appears twice", ErrHeader, name)
		}
		if name == MetadataKey {
			seenMeta = true
			// A null metadata entry is legal and means none.
			if err := dec.Decode(&meta); err != nil {
				return nil, nil, fmt.Errorf("%w: %s must map strings to strings: %w", ErrHeader, MetadataKey, err)
			}
			continue
		}
		if name == "" {
			return nil, nil, fmt.Errorf("%w: a tensor has an empty name", ErrHeader)
		}
		var e headerEntry
		if err := dec.Decode(&e); err != nil {
			return nil, nil, fmt.Errorf("%w: tensor %q: %w", ErrHeader, name, err)
		}
		info, err := e.check(name, dataSize)
		if err != nil {
			return nil, nil, err
		}
		tensors[name] = info
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, nil, fmt.Errorf("%w: %w", ErrHeader, err)
	}
	// Writers pad the header with spaces to align the data; allow any JSON
	// whitespace, nothing else.
	rest := hdr[dec.InputOffset():]
	if len(bytes.Trim(rest, " \t\r\n")) != 0 {
		return nil, nil, fmt.Errorf("%w: bytes after the header object", ErrHeader)
	}
	if err := checkOverlap(tensors); err != nil {
		return nil, nil, err
	}
	if meta == nil {
		meta = map[string]string{}
	}
	return tensors, meta, nil
}

func (e headerEntry) check(name string, dataSize int64) (TensorInfo, error) {
	bad := func(format string, args ...any) (TensorInfo, error) {
		return TensorInfo{}, fmt.Errorf("%w: tensor %q: %s", ErrHeader, name, fmt.Sprintf(format, args...))
	}
	if e.DType == nil || e.Shape == nil || e.DataOffsets == nil {
		return bad("needs dtype, shape and data_offsets")
	}
	dt := DType(*e.DType)
	size := dt.Size()
	if size == 0 {
		return TensorInfo{}, fmt.Errorf("%w: tensor %q has unknown dtype %q", ErrDType, name, *e.DType)
	}
	shape := make([]int, len(*e.Shape))
	numel := int64(1)
	for i, d := range *e.Shape {
		if d < 0 {
			return bad("negative dimension %d in shape %v", d, *e.Shape)
		}
		if d > math.MaxInt {
			return bad("dimension %d does not fit an int", d)
		}
		if d != 0 && numel > math.MaxInt64/d {
			return bad("shape %v overflows the element count", *e.Shape)
		}
		numel *= d
		shape[i] = int(d)
	}
	if numel > math.MaxInt64/size {
		return bad("shape %v overflows the byte count", *e.Shape)
	}
	offs := *e.DataOffsets
	if len(offs) != 2 {
		return bad("data_offsets has %d entries, want 2", len(offs))
	}
	begin, end := offs[0], offs[1]
	if begin > end {
		return bad("data_offsets [%d, %d] end before they begin", begin, end)
	}
	if end > uint64(dataSize) {
		return bad("data_offsets [%d, %d] run past the %d-byte data section (truncated file?)", begin, end, dataSize)
	}
	if want := numel * size; int64(end-begin) != want {
		return bad("data_offsets [%d, %d] hold %d bytes; %s %v needs %d", begin, end, end-begin, dt, shape, want)
	}
	return TensorInfo{Name: name, DType: dt, Shape: shape, Begin: int64(begin), End: int64(end)}, nil
}

// checkOverlap refuses two tensors sharing bytes: a writer never produces
// that, and a reader that allowed it would let one tensor alias another.
func checkOverlap(tensors map[string]TensorInfo) error {
	spans := make([]TensorInfo, 0, len(tensors))
	for _, t := range tensors {
		if t.End > t.Begin {
			spans = append(spans, t)
		}
	}
	slices.SortFunc(spans, func(a, b TensorInfo) int {
		return cmp.Or(cmp.Compare(a.Begin, b.Begin), strings.Compare(a.Name, b.Name))
	})
	for i := 1; i < len(spans); i++ {
		if prev, cur := spans[i-1], spans[i]; cur.Begin < prev.End {
			return fmt.Errorf("%w: tensors %q [%d, %d) and %q [%d, %d) overlap", ErrHeader, prev.Name, prev.Begin, prev.End, cur.Name, cur.Begin, cur.End)
		}
	}
	return nil
}
