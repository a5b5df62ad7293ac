package gguf

import (
	"fmt"
	"math"
)

// GGUF metadata value types, numbered as the format numbers them.
const (
	vtUint8   uint32 = 0
	vtInt8    uint32 = 1
	vtUint16  uint32 = 2
	vtInt16   uint32 = 3
	vtUint32  uint32 = 4
	vtInt32   uint32 = 5
	vtFloat32 uint32 = 6
	vtBool    uint32 = 7
	vtString  uint32 = 8
	vtArray   uint32 = 9
	vtUint64  uint32 = 10
	vtInt64   uint32 = 11
	vtFloat64 uint32 = 12
)

// maxArrayDepth bounds the nesting of arrays of arrays. Each level costs
// only 12 bytes in the file, so without a bound a hostile file could drive
// the recursive reader arbitrarily deep.
const maxArrayDepth = 16

// scalarSize returns the encoded size of a fixed-size value type, or 0 for
// strings, arrays and unknown types.
func scalarSize(vt uint32) int {
	switch vt {
	case vtUint8, vtInt8, vtBool:
		return 1
	case vtUint16, vtInt16:
		return 2
	case vtUint32, vtInt32, vtFloat32:
		return 4
	case vtUint64, vtInt64, vtFloat64:
		return 8
	}
	return 0
}

func valueTypeName(vt uint32) string {
	switch vt {
	case vtUint8:
		return "uint8"
	case vtInt8:
		return "int8"
	case vtUint16:
		return "uint16"
	case vtInt16:
		return "int16"
	case vtUint32:
		return "uint32"
	case vtInt32:
		return "int32"
	case vtFloat32:
		return "float32"
	case vtBool:
		return "bool"
	case vtString:
		return "string"
	case vtArray:
		return "array"
	case vtUint64:
		return "uint64"
	case vtInt64:
		return "int64"
	case vtFloat64:
		return "float64"
	}
	return fmt.Sprintf("unknown(%d)", vt)
}

// goTypeName names the Go type of a metadata value in error messages.
func goTypeName(v any) string {
	switch v.(type) {
	case []any:
		return "array of arrays"
	case nil:
		return "nothing"
	}
	return fmt.Sprintf("%T", v)
}

// valueType returns the GGUF value type of a Go metadata value, and for
// arrays the element type. ok is false for unsupported Go types.
func valueType(v any) (vt, elem uint32, ok bool) {
	switch v.(type) {
	case uint8:
		return vtUint8, 0, true
	case int8:
		return vtInt8, 0, true
	case uint16:
		return vtUint16, 0, true
	case int16:
		return vtInt16, 0, true
	case uint32:
		return vtUint32, 0, true
	case int32:
		return vtInt32, 0, true
	case float32:
		return vtFloat32, 0, true
	case bool:
		return vtBool, 0, true
	case string:
		return vtString, 0, true
	case uint64:
		return vtUint64, 0, true
	case int64:
		return vtInt64, 0, true
	case float64:
		return vtFloat64, 0, true
	case []uint8:
		return vtArray, vtUint8, true
	case []int8:
		return vtArray, vtInt8, true
	case []uint16:
		return vtArray, vtUint16, true
	case []int16:
		return vtArray, vtInt16, true
	case []uint32:
		return vtArray, vtUint32, true
	case []int32:
		return vtArray, vtInt32, true
	case []float32:
		return vtArray, vtFloat32, true
	case []bool:
		return vtArray, vtBool, true
	case []string:
		return vtArray, vtString, true
	case []uint64:
		return vtArray, vtUint64, true
	case []int64:
		return vtArray, vtInt64, true
	case []float64:
		return vtArray, vtFloat64, true
	case []any:
		return vtArray, vtArray, true
	}
	return 0, 0, false
}

// checkValue reports why v cannot be written as metadata, or "" if it can.
func checkValue(v any, depth int) string {
	vt, elem, ok := valueType(v)
	if !ok {
		return fmt.Sprintf("unsupported metadata type %T", v)
	}
	if vt == vtArray && depth >= maxArrayDepth {
		return fmt.Sprintf("arrays nested deeper than %d", maxArrayDepth)
	}
	if vt == vtArray && elem == vtArray {
		for i, e := range v.([]any) {
			if !isArrayValue(e) {
				return fmt.Sprintf("element %d of an array of arrays is %T, not an array", i, e)
			}
			if why := checkValue(e, depth+1); why != "" {
				return why
			}
		}
	}
	return ""
}

func isArrayValue(v any) bool {
	vt, _, ok := valueType(v)
	return ok && vt == vtArray
}

// asInt64 widens any integer metadata value; ok is false for non-integers
// and for uint64 values above math.MaxInt64 (big reports those).
func asInt64(v any) (n int64, big, ok bool) {
	switch x := v.(type) {
	case uint8:
		return int64(x), false, true
	case int8:
		return int64(x), false, true
	case uint16:
		return int64(x), false, true
	case int16:
		return int64(x), false, true
	case uint32:
		return int64(x), false, true
	case int32:
		return int64(x), false, true
	case uint64:
		if x > math.MaxInt64 {
			return 0, true, true
		}
		return int64(x), false, true
	case int64:
		return x, false, true
	}
	return 0, false, false
}
