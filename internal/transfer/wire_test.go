package transfer

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"reflect"
	"sync"
	"testing"

	"github.com/kvfence/kvfence/internal/kvpool"
	"github.com/kvfence/kvfence/internal/reqerr"
)

func testAuth(t testing.TB) *Auth {
	a, err := NewAuth([]byte("0123456789abcdef-secret"))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// sampleMessages has one message of every type with every field set.
func sampleMessages() []Message {
	room := RoomID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	var hdr [kvpool.HeaderSize]byte
	(&kvpool.Header{Fence: Fence{Room: room, Epoch: 7}, Page: 3, Ordinal: 1, Tokens: 16, Checksum: 0xabcdef01,
		Flags: kvpool.FlagChecksum | kvpool.FlagTransfer}).Put(hdr[:])
	env := Envelope{Room: room}
	return []Message{
		&Open{Envelope: env, Prefill: 4, PromptTokens: 1000, MaxTokens: 24},
		&Prefill{Envelope: env, Decode: 5, PromptTokens: 1000, MaxTokens: 24},
		&Grant{Envelope: env, Key: 1<<40 + 3, PromptTokens: 33, PageCount: 3, Pages: []int32{9, 2, 5}, Epochs: []uint64{1, 1 << 33, 4}},
		&Reject{Envelope: env, Kind: reqerr.KindContextLength, Prompt: 5000, MaxTokens: 100, Limit: 4096},
		&Write{Envelope: env, Key: 77, Page: 3, Header: hdr, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}},
		&Done{Envelope: env, Pages: 3, Tokens: 33, Checksums: []uint32{1, 2, 0xffffffff}, FirstToken: -1},
		&Abort{Envelope: env, Reason: reqerr.KindAborted, Decode: 5},
		&Drained{Envelope: env},
		&PeerEpoch{Peer: 4, Epoch: 1 << 50},
	}
}

func TestWireRoundTrip(t *testing.T) {
	auth := testAuth(t)
	var stream []byte
	msgs := sampleMessages()
	for _, m := range msgs {
		auth.Sign(m)
		b := Encode(m)
		got, n, err := Decode(b)
		if err != nil || n != len(b) {
			t.Fatalf("%v: Decode = %v, %d of %d bytes", m.Type(), err, n, len(b))
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%v: round trip\n got %#v\nwant %#v", m.Type(), got, m)
		}
		if !auth.Verify(got) {
			t.Errorf("%v: MAC does not verify after the round trip", m.Type())
		}
		stream = append(stream, b...)
	}
	// Frames decode one after another from a stream.
	for i := 0; len(stream) > 0; i++ {
		m, n, err := Decode(stream)
		if err != nil || m.Type() != msgs[i].Type() {
			t.Fatalf("stream frame %d: %v %v", i, m, err)
		}
		stream = stream[n:]
	}
}

func TestAppendWriteHead(t *testing.T) {
	w := sampleMessages()[4].(*Write)
	testAuth(t).Sign(w)
	if got := append(AppendWriteHead(nil, w), w.Data...); !bytes.Equal(got, Encode(w)) {
		t.Fatal("head + data differs from the encoded frame")
	}
}

func TestWireRejectsMalformed(t *testing.T) {
	auth := testAuth(t)
	grant := sampleMessages()[2]
	auth.Sign(grant)
	good := Encode(grant)
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	setLen := func(b []byte) []byte { binary.LittleEndian.PutUint32(b, uint32(len(b)-4)); return b }
	tests := []struct {
		name  string
		frame []byte
	}{
		{"version", mut(func(b []byte) []byte { b[4] = 2; return b })},
		{"type zero", mut(func(b []byte) []byte { b[5] = 0; return b })},
		{"type unknown", mut(func(b []byte) []byte { b[5] = 200; return b })},
		{"trailing byte", mut(func(b []byte) []byte { return setLen(append(b, 0)) })},
		{"missing MAC byte", mut(func(b []byte) []byte { return setLen(b[:len(b)-1]) })},
		{"page count beyond frame", mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[4+18+16:], 1000); return b })},
		{"huge frame", mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b, MaxFrame+1); return b })},
		{"frame shorter than header", []byte{3, 0, 0, 0, 1, 3, 0}},
		{"reject kind", func() []byte {
			r := &Reject{Kind: reqerr.KindIntegrity}
			b := Encode(r)
			b[4+18] = 250
			return b
		}()},
		{"write data length", func() []byte {
			w := sampleMessages()[4]
			b := Encode(w)
			return setLen(b[:len(b)-1])
		}()},
	}
	for _, tt := range tests {
		if _, _, err := Decode(tt.frame); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Decode = %v, want ErrMalformed", tt.name, err)
		}
	}
	for i := range len(good) {
		if _, _, err := Decode(good[:i]); err == nil {
			t.Fatalf("prefix of %d bytes decoded", i)
		} else if i < 4 || i > 4+headSize+MACSize {
			if !errors.Is(err, ErrShortFrame) {
				t.Errorf("prefix of %d bytes: %v, want ErrShortFrame", i, err)
			}
		}
	}
}

func TestAuth(t *testing.T) {
	auth := testAuth(t)
	other, _ := NewAuth([]byte("another cluster's secret"))
	if _, err := NewAuth([]byte("short")); err == nil {
		t.Error("short secret accepted")
	}
	for _, m := range sampleMessages() {
		auth.Sign(m)
		if !auth.Verify(m) {
			t.Errorf("%v: own MAC rejected", m.Type())
		}
		if other.Verify(m) {
			t.Errorf("%v: MAC verified under another secret", m.Type())
		}
	}
	// The MAC covers every field: changing one breaks it.
	g := sampleMessages()[2].(*Grant)
	auth.Sign(g)
	g.Pages[1]++
	if auth.Verify(g) {
		t.Error("MAC still verifies after a page id changed")
	}
	d := sampleMessages()[1].(*Prefill)
	auth.Sign(d)
	d.Room[0]++
	if auth.Verify(d) {
		t.Error("MAC still verifies after the room changed")
	}
	// A Write's MAC covers its header, not its data (the checksum does).
	w := sampleMessages()[4].(*Write)
	auth.Sign(w)
	w.Data[0]++
	if !auth.Verify(w) {
		t.Error("Write MAC covers data")
	}
	w.Header[40]++
	if auth.Verify(w) {
		t.Error("Write MAC does not cover the page header")
	}
}

// TestAuthReusedStatesAgree: the pooled HMAC states give exactly the MAC a
// fresh HMAC gives, from many goroutines at once (run under -race), so
// reuse can neither leak one message's bytes into another's MAC nor race.
func TestAuthReusedStatesAgree(t *testing.T) {
	auth := testAuth(t)
	fresh := func(m Message) [MACSize]byte {
		h := hmac.New(sha256.New, auth.key)
		h.Write(appendSigned(nil, m))
		var out [MACSize]byte
		copy(out[:], h.Sum(nil))
		return out
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				msgs := sampleMessages()
				m := msgs[(g+i)%len(msgs)]
				m.Env().Room[0] = byte(i)
				auth.Sign(m)
				if m.Env().MAC != fresh(m) || !auth.Verify(m) {
					t.Errorf("goroutine %d, message %d (%v): pooled MAC differs from a fresh one", g, i, m.Type())
					return
				}
			}
		})
	}
	wg.Wait()
}

func FuzzDecode(f *testing.F) {
	auth := testAuth(f)
	for _, m := range sampleMessages() {
		auth.Sign(m)
		f.Add(Encode(m))
	}
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, n, err := Decode(b)
		if err != nil {
			if m != nil || n != 0 {
				t.Fatalf("error %v with message %v and n %d", err, m, n)
			}
			return
		}
		if n < lenPrefix+headSize+MACSize || n > len(b) {
			t.Fatalf("n = %d of %d", n, len(b))
		}
		// The format is canonical: a decoded message re-encodes to the
		// bytes it came from.
		if re := Encode(m); !bytes.Equal(re, b[:n]) {
			t.Fatalf("%v re-encodes differently:\n in  %x\n out %x", m.Type(), b[:n], re)
		}
		_ = m.String()
	})
}
