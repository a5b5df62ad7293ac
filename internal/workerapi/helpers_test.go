package workerapi

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"testing"

	"github.com/kvfence/kvfence/internal/transfer"
)

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func jsonGenerate(e *env, tenant string) ([]byte, error) {
	r := e.genRequest(tenant)
	return json.Marshal(generateJSON{Open: transfer.Encode(r.Open), Tenant: r.Tenant, Prompt: r.Prompt, MaxTokens: r.MaxTokens})
}

func mustAuth() *transfer.Auth {
	a, err := transfer.NewAuth(testSecret)
	if err != nil {
		panic(err)
	}
	return a
}

func mkTemp() (string, error) { return os.MkdirTemp("", "workerapi-test-") }

func TestMain(m *testing.M) {
	code := m.Run()
	if tinyDir != "" {
		os.RemoveAll(tinyDir)
	}
	os.Exit(code)
}
