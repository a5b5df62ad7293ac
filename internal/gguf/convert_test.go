package gguf

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func isNaN32(f float32) bool { return f != f }

func TestF16AllValuesRoundTrip(t *testing.T) {
	for h := range 1 << 16 {
		f := F16ToF32(uint16(h))
		back := F32ToF16(f)
		if isNaN32(f) {
			// A NaN stays a NaN with its sign and payload, made quiet.
			if back != uint16(h)|0x200 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, back)
		}
	}
}

func TestF16Conversions(t *testing.T) {
	p := func(e int) float32 { return float32(math.Ldexp(1, e)) }
	cases := []struct {
		f    float32
		want uint16
	}{
		{0, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3c00},
		{-2, 0xc000},
		{65504, 0x7bff},                  // largest half
		{65519.99, 0x7bff},               // below the midpoint to Inf
		{65520, 0x7c00},                  // midpoint: ties to even is Inf
		{1e10, 0x7c00},                   // overflow
		{-1e10, 0xfc00},                  // negative overflow
		{float32(math.Inf(1)), 0x7c00},   // Inf
		{float32(math.Inf(-1)), 0xfc00},  // -Inf
		{p(-14), 0x0400},                 // smallest normal
		{p(-24), 0x0001},                 // smallest subnormal
		{p(-25), 0x0000},                 // half of it: tie to even (0)
		{p(-25) * 1.0000001, 0x0001},     // just above the tie
		{3 * p(-25), 0x0002},             // tie between 1 and 2 -> 2
		{5 * p(-25), 0x0002},             // tie between 2 and 3 -> 2
		{p(-14) - p(-25), 0x0400},        // tie between largest subnormal and smallest normal
		{1 + p(-11), 0x3c00},             // tie -> even (1.0)
		{1 + 3*p(-11), 0x3c02},           // tie -> even (1+2^-9)
		{1 + p(-11) + p(-20), 0x3c01},    // just above the tie
		{math.SmallestNonzeroFloat32, 0}, // float32 subnormal -> 0
		{-math.SmallestNonzeroFloat32, 0x8000},
	}
	for _, c := range cases {
		if got := F32ToF16(c.f); got != c.want {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	if got := F32ToF16(float32(math.NaN())); got&0x7c00 != 0x7c00 || got&0x3ff == 0 {
		t.Errorf("F32ToF16(NaN) = %#04x, not a NaN", got)
	}
	if got := F16ToF32(0x0001); got != p(-24) {
		t.Errorf("F16ToF32(1) = %g", got)
	}
}

// TestF16NearestRandom checks F32ToF16 against a brute-force definition of
// round to nearest, ties to even: no neighbour of the result is closer.
func TestF16NearestRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		f := float32(math.Ldexp(r.Float64()*2-1, r.IntN(42)-26))
		if math.Abs(float64(f)) >= 65520 { // rounds to Inf, tested above
			continue
		}
		h := F32ToF16(f)
		got := float64(F16ToF32(h))
		dist := math.Abs(got - float64(f))
		for _, n := range []uint16{h - 1, h + 1} {
			if n&0x7c00 == 0x7c00 || (n^h)&0x8000 != 0 {
				continue
			}
			nd := math.Abs(float64(F16ToF32(n)) - float64(f))
			if nd < dist || (nd == dist && n&1 == 0) {
				t.Fatalf("F32ToF16(%g) = %#04x (%g), but %#04x (%g) is nearer or an even tie", f, h, got, n, F16ToF32(n))
			}
		}
	}
}

func TestBF16(t *testing.T) {
	for h := range 1 << 16 {
		f := BF16ToF32(uint16(h))
		back := F32ToBF16(f)
		if isNaN32(f) {
			if back != uint16(h)|0x40 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, back)
		}
	}
	p := func(e int) float32 { return float32(math.Ldexp(1, e)) }
	cases := []struct {
		f    float32
		want uint16
	}{
		{1, 0x3f80},
		{1 + p(-8), 0x3f80},          // tie -> even
		{1 + 3*p(-8), 0x3f82},        // tie -> even (up)
		{1 + p(-8) + p(-20), 0x3f81}, // above the tie
		{math.MaxFloat32, 0x7f80},    // rounds up to Inf
		{float32(math.Inf(-1)), 0xff80},
		{math.SmallestNonzeroFloat32, 0x0000}, // subnormal: 2^-149 rounds to 0
		{p(-133), 0x0001},                     // smallest bf16 subnormal is kept
	}
	for _, c := range cases {
		if got := F32ToBF16(c.f); got != c.want {
			t.Errorf("F32ToBF16(%g) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	// A NaN whose payload sits only in the low bits must not become Inf.
	if got := F32ToBF16(math.Float32frombits(0x7f800001)); got&0x7f != 0x40 || got&0x7f80 != 0x7f80 {
		t.Errorf("F32ToBF16(signalling NaN) = %#04x", got)
	}
}

func TestQ8_0Block(t *testing.T) {
	x := make([]float32, 32)
	x[0], x[1], x[2], x[3], x[4] = 127, -63.5, 2.5, -0.49, -127
	data, err := Quantize(TypeQ8_0, x)
	if err != nil {
		t.Fatal(err)
	}
	if d := binary.LittleEndian.Uint16(data); d != 0x3c00 {
		t.Errorf("scale %#04x, want 0x3c00 (1.0)", d)
	}
	// round() ties away from zero: -63.5 -> -64, 2.5 -> 3.
	want := []int8{127, -64, 3, 0, -127}
	for i, w := range want {
		if int8(data[2+i]) != w {
			t.Errorf("quant %d = %d, want %d", i, int8(data[2+i]), w)
		}
	}
	y := make([]float32, 32)
	must(t, Dequantize(TypeQ8_0, data, y))
	if y[1] != -64 || y[2] != 3 || y[5] != 0 {
		t.Errorf("dequantized %v", y[:6])
	}
}

func TestQ4_0Block(t *testing.T) {
	x := make([]float32, 32)
	x[0], x[1], x[2], x[3], x[16] = -8, 7, 0.4, -0.6, 3
	data, err := Quantize(TypeQ4_0, x)
	if err != nil {
		t.Fatal(err)
	}
	if d := binary.LittleEndian.Uint16(data); d != 0x3c00 { // -8 / -8 = 1
		t.Errorf("scale %#04x, want 0x3c00", d)
	}
	// trunc(x/d + 8.5), capped at 15; element 16 is the high nibble of byte 0.
	wantLo := []byte{0, 15, 8, 7}
	for i, w := range wantLo {
		if data[2+i]&0xf != w {
			t.Errorf("low nibble %d = %d, want %d", i, data[2+i]&0xf, w)
		}
	}
	if hi := data[2] >> 4; hi != 11 {
		t.Errorf("high nibble 0 = %d, want 11", hi)
	}
	y := make([]float32, 32)
	must(t, Dequantize(TypeQ4_0, data, y))
	for i, w := range map[int]float32{0: -8, 1: 7, 2: 0, 3: -1, 16: 3, 17: 0} {
		if y[i] != w {
			t.Errorf("y[%d] = %g, want %g", i, y[i], w)
		}
	}
	// A positive extreme gives a negative scale.
	x[0] = 8
	data, _ = Quantize(TypeQ4_0, x)
	must(t, Dequantize(TypeQ4_0, data, y))
	if y[0] != 8 {
		t.Errorf("positive extreme dequantized to %g", y[0])
	}
}

func TestQuantizeErrorBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	x := make([]float32, 32*64)
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Ldexp(1, i/32%20-10))
	}
	for _, typ := range []TensorType{TypeF32, TypeF16, TypeBF16, TypeQ8_0, TypeQ4_0} {
		data, err := Quantize(typ, x)
		if err != nil {
			t.Fatal(typ, err)
		}
		y := make([]float32, len(x))
		must(t, Dequantize(typ, data, y))
		for b := 0; b < len(x)/32; b++ {
			var amax float64
			for _, v := range x[32*b : 32*b+32] {
				amax = max(amax, math.Abs(float64(v)))
			}
			for i := 32 * b; i < 32*b+32; i++ {
				e := math.Abs(float64(y[i] - x[i]))
				var bound float64
				switch typ {
				case TypeF32:
					bound = 0
				case TypeF16:
					bound = math.Abs(float64(x[i]))*math.Ldexp(1, -11) + math.Ldexp(1, -25)
				case TypeBF16:
					bound = math.Abs(float64(x[i])) * math.Ldexp(1, -8)
				case TypeQ8_0:
					bound = amax/127*0.5*1.01 + amax*math.Ldexp(1, -11)
				case TypeQ4_0:
					bound = amax/8*1.01 + amax*math.Ldexp(1, -10)
				}
				if e > bound {
					t.Fatalf("%s element %d: %g -> %g, error %g > %g", typ, i, x[i], y[i], e, bound)
				}
			}
		}
	}
}

func TestQuantizeRejects(t *testing.T) {
	cases := []struct {
		typ  TensorType
		x    []float32
		want string
	}{
		{TypeQ8_0, make([]float32, 31), "31 elements is not a whole number of Q8_0 blocks of 32"},
		{TypeQ4_K, make([]float32, 256), "Quantize does not support Q4_K"},
		{TensorType(77), make([]float32, 4), "unknown tensor type 77"},
		{TypeQ8_0, append(make([]float32, 31), float32(math.NaN())), "Q8_0 block 0: element 31 is not finite"},
		{TypeQ4_0, append(make([]float32, 32), float32(math.Inf(1))), "Q4_0 block 1: element 0 is not finite"},
		{TypeQ8_0, append(make([]float32, 31), 1e38), "overflows F16"},
	}
	for _, c := range cases {
		if c.typ == TypeQ4_0 {
			c.x = append(c.x, make([]float32, 31)...)
		}
		_, err := Quantize(c.typ, c.x)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Quantize(%s, %d values): %v, want %q", c.typ, len(c.x), err, c.want)
		}
	}
	if err := Dequantize(TypeF16, make([]byte, 3), make([]float32, 2)); err == nil || !strings.Contains(err.Error(), "3 bytes for 2 elements, want 4") {
		t.Errorf("Dequantize short: %v", err)
	}
	if err := Dequantize(TypeQ5_K, make([]byte, 176), make([]float32, 256)); err == nil || !strings.Contains(err.Error(), "does not support Q5_K") {
		t.Errorf("Dequantize Q5_K: %v", err)
	}
}

// packQ4KScales packs 8 six-bit scales and mins the way Q4_K stores them.
func packQ4KScales(sc, m [8]uint8) [12]byte {
	var s [12]byte
	for j := range 4 {
		s[j] = sc[j]&63 | (sc[j+4]>>4)<<6
		s[j+4] = m[j]&63 | (m[j+4]>>4)<<6
		s[j+8] = sc[j+4]&0xf | (m[j+4]&0xf)<<4
	}
	return s
}

func TestQ4_KDequantize(t *testing.T) {
	sc := [8]uint8{1, 2, 3, 4, 37, 63, 16, 5}
	m := [8]uint8{0, 1, 2, 63, 4, 50, 33, 7}
	block := make([]byte, 144)
	binary.LittleEndian.PutUint16(block[0:], 0x3c00) // d = 1
	binary.LittleEndian.PutUint16(block[2:], 0x3800) // dmin = 0.5
	s := packQ4KScales(sc, m)
	copy(block[4:16], s[:])
	for i := range 128 {
		block[16+i] = byte(i*37 + 11)
	}
	y := make([]float32, 256)
	must(t, Dequantize(TypeQ4_K, block, y))
	for i := range 256 {
		g, half, l := i/64, i%64/32, i%32
		q := block[16+32*g+l]
		if half == 0 {
			q &= 0xf
		} else {
			q >>= 4
		}
		sub := 2*g + half
		want := float32(sc[sub])*float32(q) - 0.5*float32(m[sub])
		if y[i] != want {
			t.Fatalf("y[%d] = %g, want %g (sub-block %d, q %d)", i, y[i], want, sub, q)
		}
	}
}

func TestRowBytes(t *testing.T) {
	cases := []struct {
		typ  TensorType
		n    int
		want int
		err  string
	}{
		{TypeF32, 3, 12, ""},
		{TypeF16, 3, 6, ""},
		{TypeBF16, 4, 8, ""},
		{TypeQ8_0, 64, 68, ""},
		{TypeQ4_0, 32, 18, ""},
		{TypeQ4_K, 512, 288, ""},
		{TypeQ4_K, 128, 0, "not a whole number"},
		{TypeF32, -1, 0, "not a whole number"},
		{TensorType(5), 32, 0, "unknown tensor type 5"},
	}
	for _, c := range cases {
		got, err := c.typ.RowBytes(c.n)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s.RowBytes(%d): %v, want error %q", c.typ, c.n, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s.RowBytes(%d) = %d, %v, want %d", c.typ, c.n, got, err, c.want)
		}
	}
	names := map[TensorType]string{TypeF32: "F32", TypeQ8_0: "Q8_0", TypeBF16: "BF16", TypeQ4_K: "Q4_K", TensorType(4): "type(4)"}
	for typ, want := range names {
		if typ.String() != want {
			t.Errorf("String() = %q, want %q", typ.String(), want)
		}
	}
}
