// Package spec holds the Promela model of the kvfence transfer protocol
// (transfer.pml) and the test that model-checks it with spin: the safe
// configuration must verify, and each configuration with a protection
// removed must produce a counterexample. See README.md.
package spec
