package engine

import "os"

func mkdirTemp() (string, error) { return os.MkdirTemp("", "kvfence-engine-test-") }
