package sampling

import "unsafe"

// unsafeString views b as a string for read-only searching; the string
// must not outlive the next change to b.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
