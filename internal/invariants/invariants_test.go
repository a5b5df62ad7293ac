package invariants

import "testing"

func TestAssertPanicsOnFalse(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Assert(false) did not panic")
		}
	}()
	Assert(false, "test")
}

func TestAssertQuietOnTrue(t *testing.T) {
	Assert(true, "test")
}
