package workerapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
)

// AuthHeader carries the request's HMAC.
const AuthHeader = "X-Kvfence-Auth"

// sign returns the hex HMAC-SHA256 of method|path|body under secret.
func sign(secret []byte, method, path string, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(method))
	m.Write([]byte{'|'})
	m.Write([]byte(path))
	m.Write([]byte{'|'})
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// verify checks a request's header value in constant time.
func verify(secret []byte, method, path string, body []byte, header string) bool {
	got, err := hex.DecodeString(header)
	if err != nil || len(got) != sha256.Size {
		return false
	}
	want, _ := hex.DecodeString(sign(secret, method, path, body))
	return hmac.Equal(got, want)
}
