// Package inproc is the in-process transfer transport: one Pair joins a
// prefill worker and a decode worker in the same process (kvfence serve,
// and tests), implementing package link's contract.
//
// Delivery is asynchronous, as between processes: each direction has a
// bounded queue and its own goroutine, and page writes are copied into the
// decode pool by that goroutine, through the decode side's window table,
// some time after they were posted — never inside Post. A Pair can drop its
// connection and make a new one (Disconnect, Connect, Reconnect), which the
// workers see as a peer-epoch change, so tests can drive the peer-lost paths
// without sockets.
package inproc
