package sampling

import (
	"math"
	"testing"
)

func TestExpNeg(t *testing.T) {
	worst := 0.0
	for i := 0; i <= 200000; i++ {
		x := -float64(i) * 700 / 200000
		got, want := expNeg(x), math.Exp(x)
		if rel := math.Abs(got-want) / want; rel > worst {
			worst = rel
		}
	}
	if worst > 2e-10 {
		t.Errorf("worst relative error %g", worst)
	}
	if expNeg(0) != 1 || expNeg(-1000) != 0 || expNeg(math.Inf(-1)) != 0 {
		t.Error("edge values")
	}
}
