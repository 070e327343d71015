package hivemind

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/abi/half"
	hivemindv1 "github.com/moehost/moehost/gen/hivemind/v1"
)

// Tensor is a tensor as the experts take it: little-endian elements of
// DType in row-major order. Compressed wire formats decode to the dtype
// the sender named (float32 for a float32 tensor sent as FLOAT16).
type Tensor struct {
	DType abi.DType
	Shape []int
	Data  []byte
}

// ErrBadTensor marks a tensor that cannot be decoded: a bad dtype, size,
// buffer length or compression.
var ErrBadTensor = errors.New("bad tensor")

// maxDims bounds a tensor's rank, as torch does (64).
const maxDims = 64

// dtypeByName maps the numpy/torch dtype names hivemind sends (without
// "torch.") to ours; others are refused.
var dtypeByName = map[string]abi.DType{
	"float32":  abi.DTypeFloat32,
	"float16":  abi.DTypeFloat16,
	"bfloat16": abi.DTypeBFloat16,
	"int32":    abi.DTypeInt32,
	"int64":    abi.DTypeInt64,
	"bool":     abi.DTypeBool,
}

// dtypeName is the name hivemind gives dt on the wire.
func dtypeName(dt abi.DType) string {
	for n, d := range dtypeByName {
		if d == dt {
			return n
		}
	}
	return "invalid"
}

// torchName is the name hivemind's schema gives dt ("torch.float32").
func torchName(dt abi.DType) string { return "torch." + dtypeName(dt) }

// numel checks a wire size and returns the shape and element count.
func numel(size []uint32) ([]int, int, error) {
	if len(size) > maxDims {
		return nil, 0, fmt.Errorf("%w: %d dimensions, at most %d", ErrBadTensor, len(size), maxDims)
	}
	shape := make([]int, len(size))
	n := 1
	for i, d := range size {
		shape[i] = int(d)
		if d != 0 && n > math.MaxInt32/int(d) {
			return nil, 0, fmt.Errorf("%w: size %v has more than 2^31 elements", ErrBadTensor, size)
		}
		n *= int(d)
	}
	return shape, n, nil
}

// DecodeTensor decodes one wire tensor (all its parts joined). maxBytes
// bounds the decoded data; it is checked from the size alone, before
// anything is allocated. Buffers that arrive uncompressed are used in
// place, not copied.
func DecodeTensor(pb *hivemindv1.Tensor, maxBytes int) (Tensor, error) {
	dt, ok := dtypeByName[pb.GetDtype()]
	if !ok {
		return Tensor{}, fmt.Errorf("%w: dtype %q: want one of float32, float16, bfloat16, int32, int64, bool", ErrBadTensor, pb.GetDtype())
	}
	shape, n, err := numel(pb.GetSize())
	if err != nil {
		return Tensor{}, err
	}
	buf := pb.GetBuffer()
	comp := pb.GetCompression()
	out := dt
	if comp != hivemindv1.CompressionType_COMPRESSION_TYPE_NONE {
		if dt != abi.DTypeFloat32 && dt != abi.DTypeFloat16 {
			return Tensor{}, fmt.Errorf("%w: compression %s of a %s tensor: only float32 and float16 tensors are compressed", ErrBadTensor, comp, pb.GetDtype())
		}
	}
	if int64(n)*int64(out.Size()) > int64(maxBytes) {
		return Tensor{}, fmt.Errorf("%w: size %v is %d bytes decoded, over the limit of %d", ErrBadTensor, shape, int64(n)*int64(out.Size()), maxBytes)
	}
	want := func(what string, bytes int) error {
		if len(buf) != bytes {
			return fmt.Errorf("%w: %s buffer of size %v is %d bytes, want %d", ErrBadTensor, what, shape, len(buf), bytes)
		}
		return nil
	}
	switch comp {
	case hivemindv1.CompressionType_COMPRESSION_TYPE_NONE:
		if dt == abi.DTypeBFloat16 && n > 0 && len(buf) == 4*n {
			// Legacy bfloat16: sent widened to float32.
			return Tensor{DType: abi.DTypeFloat32, Shape: shape, Data: buf}, nil
		}
		if err := want("uncompressed "+pb.GetDtype(), n*dt.Size()); err != nil {
			return Tensor{}, err
		}
		return Tensor{DType: dt, Shape: shape, Data: buf}, nil
	case hivemindv1.CompressionType_COMPRESSION_TYPE_FLOAT16:
		if err := want("FLOAT16", 2*n); err != nil {
			return Tensor{}, err
		}
		if dt == abi.DTypeFloat16 {
			return Tensor{DType: dt, Shape: shape, Data: buf}, nil
		}
		f := make([]float32, n)
		if err := half.Decode(abi.DTypeFloat16, f, buf); err != nil {
			return Tensor{}, fmt.Errorf("%w: %w", ErrBadTensor, err)
		}
		return finish(dt, shape, f), nil
	case hivemindv1.CompressionType_COMPRESSION_TYPE_MEANSTD_16BIT:
		if len(shape) == 0 || shape[len(shape)-1] == 0 {
			return Tensor{}, fmt.Errorf("%w: MEANSTD_16BIT needs a last dimension of at least 1, got size %v", ErrBadTensor, shape)
		}
		last := shape[len(shape)-1]
		stats := n / last
		if err := want("MEANSTD_16BIT", 2*n+8*stats); err != nil {
			return Tensor{}, err
		}
		f := make([]float32, n)
		if err := half.Decode(abi.DTypeFloat16, f, buf[:2*n]); err != nil {
			return Tensor{}, fmt.Errorf("%w: %w", ErrBadTensor, err)
		}
		means, stds := buf[2*n:2*n+4*stats], buf[2*n+4*stats:]
		for r := range stats {
			mean := math.Float32frombits(binary.LittleEndian.Uint32(means[4*r:]))
			std := math.Float32frombits(binary.LittleEndian.Uint32(stds[4*r:]))
			row := f[r*last : (r+1)*last]
			for i := range row {
				row[i] = row[i]*std + mean
			}
		}
		return finish(dt, shape, f), nil
	case hivemindv1.CompressionType_COMPRESSION_TYPE_QUANTILE_8BIT, hivemindv1.CompressionType_COMPRESSION_TYPE_UNIFORM_8BIT:
		if len(buf) < 8 {
			return Tensor{}, fmt.Errorf("%w: %s buffer of %d bytes has no codebook length", ErrBadTensor, comp, len(buf))
		}
		books := binary.LittleEndian.Uint64(buf)
		if books > 256 {
			return Tensor{}, fmt.Errorf("%w: %s codebook of %d entries, at most 256", ErrBadTensor, comp, books)
		}
		nb := int(books)
		if err := want(comp.String(), 8+4*nb+n); err != nil {
			return Tensor{}, err
		}
		book := make([]float32, nb)
		for i := range book {
			book[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[8+4*i:]))
		}
		codes := buf[8+4*nb:]
		f := make([]float32, n)
		for i, c := range codes {
			if int(c) >= nb {
				return Tensor{}, fmt.Errorf("%w: %s code %d at element %d is past the codebook's %d entries", ErrBadTensor, comp, c, i, nb)
			}
			f[i] = book[c]
		}
		return finish(dt, shape, f), nil
	case hivemindv1.CompressionType_COMPRESSION_TYPE_BLOCKWISE_8BIT:
		return Tensor{}, fmt.Errorf("%w: BLOCKWISE_8BIT (bitsandbytes) is not supported; the schema asks for %s", ErrBadTensor, "NONE")
	}
	return Tensor{}, fmt.Errorf("%w: unknown compression %d", ErrBadTensor, int32(comp))
}

// finish stores decoded floats as dt (float32, or float16 rounded back).
func finish(dt abi.DType, shape []int, f []float32) Tensor {
	if dt == abi.DTypeFloat16 {
		b := make([]byte, 2*len(f))
		_ = half.Encode(abi.DTypeFloat16, b, f)
		return Tensor{DType: dt, Shape: shape, Data: b}
	}
	return Tensor{DType: abi.DTypeFloat32, Shape: shape, Data: float32Bytes(f)}
}

// float32Bytes returns f's little-endian bytes.
func float32Bytes(f []float32) []byte {
	b := make([]byte, 4*len(f))
	for i, v := range f {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// float32s reads little-endian float32s.
func float32s(b []byte) []float32 {
	f := make([]float32, len(b)/4)
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return f
}

// fp16Max is float16's largest finite value; hivemind clamps to it.
const fp16Max = 65504

// EncodeTensor serializes t with comp, as hivemind's server does for its
// outputs: NONE keeps the bytes; FLOAT16 and MEANSTD_16BIT apply to
// float32 tensors and keep "float32" as the dtype name.
func EncodeTensor(t Tensor, comp hivemindv1.CompressionType) (*hivemindv1.Tensor, error) {
	size := make([]uint32, len(t.Shape))
	for i, d := range t.Shape {
		size[i] = uint32(d)
	}
	pb := &hivemindv1.Tensor{Size: size, Dtype: dtypeName(t.DType), Compression: comp, RequiresGrad: false}
	if comp != hivemindv1.CompressionType_COMPRESSION_TYPE_NONE && t.DType != abi.DTypeFloat32 {
		comp = hivemindv1.CompressionType_COMPRESSION_TYPE_NONE
		pb.Compression = comp
	}
	switch comp {
	case hivemindv1.CompressionType_COMPRESSION_TYPE_NONE:
		pb.Buffer = t.Data
	case hivemindv1.CompressionType_COMPRESSION_TYPE_FLOAT16:
		f := float32s(t.Data)
		for i, v := range f {
			f[i] = max(-fp16Max, min(fp16Max, v))
		}
		pb.Buffer = make([]byte, 2*len(f))
		_ = half.Encode(abi.DTypeFloat16, pb.Buffer, f)
	case hivemindv1.CompressionType_COMPRESSION_TYPE_MEANSTD_16BIT:
		if len(t.Shape) == 0 || t.Shape[len(t.Shape)-1] == 0 {
			return nil, fmt.Errorf("MEANSTD_16BIT needs a last dimension, got shape %v", t.Shape)
		}
		f := float32s(t.Data)
		last := t.Shape[len(t.Shape)-1]
		stats := len(f) / last
		means, stds := make([]float32, stats), make([]float32, stats)
		const eps = 1.1920929e-07 // float32's machine epsilon, hivemind's floor on std
		for r := range stats {
			row := f[r*last : (r+1)*last]
			var sum float64
			for _, v := range row {
				sum += float64(v)
			}
			mean := float32(sum / float64(last))
			var sq float64
			for i := range row {
				row[i] -= mean
				sq += float64(row[i]) * float64(row[i])
			}
			std := max(float32(math.Sqrt(sq)/math.Sqrt(float64(last))), eps)
			for i := range row {
				row[i] = max(-fp16Max, min(fp16Max, row[i]/std))
			}
			means[r], stds[r] = mean, std
		}
		pb.Buffer = make([]byte, 2*len(f), 2*len(f)+8*stats)
		_ = half.Encode(abi.DTypeFloat16, pb.Buffer, f)
		pb.Buffer = append(pb.Buffer, float32Bytes(means)...)
		pb.Buffer = append(pb.Buffer, float32Bytes(stds)...)
	default:
		return nil, fmt.Errorf("output compression %s is not supported; use NONE, FLOAT16 or MEANSTD_16BIT", comp)
	}
	return pb, nil
}
