// Package layers holds no code, only the test that keeps kvfence's
// dependencies pointing one way (DESIGN.md §9): each package may import only
// packages listed before it in Order. kvpool knows nothing of transfer,
// transfer nothing of the engine or the router, the model nothing of tenants.
package layers

// Order lists the internal packages from the bottom of the stack to the top.
// A package may import only packages that come before it. Packages on the
// same line of thought stay adjacent; a new package must be added here, in
// the place its dependencies allow, or the test fails.
var Order = []string{
	"reqerr",
	"invariants",
	"gguf",
	"tokenizer",
	"kernels",
	"modelbuild",
	"model",
	"sampling",
	"kvpool",
	"transfer",
	"transfer/link",
	"transfer/inproc",
	"transfer/tcp",
	"sim",
	"engine",
	"workerapi",
	"metrics",
	"router/tenants",
	"router/api",
	"router",
	"audit",
	"layers",
}
