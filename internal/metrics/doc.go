// Package metrics exports the workers' own counters and gauges (KV pool
// accounting, deferred releases, fence and checksum failures, rejected
// admissions) to Prometheus. A Collector reads each worker's statistics at
// scrape time, so the workers keep plain counters and never touch the
// Prometheus client on their hot paths.
//
// Labels hold roles, page states, outcomes and reason names: fixed sets,
// never tenant names, rooms or request data.
package metrics
