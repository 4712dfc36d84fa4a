package idempotency

import (
	"context"
	"database/sql"
	"sync"
	"time"
)

// Waiting for a key that another request holds, as the Node client waits:
// never inside idem_claim(wait => ...), which would hold a connection per
// waiting request, and never with a poll per waiting request, which would
// cost the database one statement per request and tick. Instead:
//
//   - the first try is one statement (in transaction mode BEGIN, the claim,
//     COMMIT); duplicates that arrive while it runs take its answer;
//   - while the answer is *InProgress or *RetryLater, the duplicates of one
//     key (same *sql.DB, mode, scope, lease and request) share one poller
//     in this process, which tries again after 25 ms, then each time twice
//     as long, at most 250 ms apart;
//   - a try that finds the key settled answers them all; one that claims it
//     hands the claim to the request that has waited longest (the others
//     wait on); a request whose own wait has passed leaves with the last
//     answer;
//   - a try that fails (the database restarting) answers nobody: the next
//     one may find the key settled. A request whose wait passes while the
//     latest try failed leaves with that error.
//
// So a crowd of duplicates costs at most about four statements a second per
// key and process, however large it is.

const (
	firstPoll = 25 * time.Millisecond
	maxPoll   = 250 * time.Millisecond
)

// tryResult is one try's answer. When the key is ours (*Claimed, or
// *registered), tx is its open transaction in transaction and register
// modes, and abandon gives the key back if nobody takes it.
type tryResult struct {
	res     Result
	tx      *sql.Tx
	abandon func()
}

type tryFunc func(ctx context.Context) (tryResult, error)

type waitKey struct {
	db *sql.DB
	id string
}

type waitAnswer struct {
	r   tryResult
	err error
}

type waiter struct {
	deadline time.Time
	answer   chan waitAnswer // buffered: the poller never blocks on it
}

type waitGroup struct {
	key     waitKey
	try     tryFunc
	last    Result // the last *InProgress or *RetryLater seen
	lastErr error  // the latest try's error, until a try succeeds
	members []*waiter
}

type leadingTry struct {
	done chan struct{}
	r    tryResult
	err  error
}

// waits holds every group and first try of the process; one lock guards
// them all (the work under it is a few slice operations).
var waits = struct {
	sync.Mutex
	groups  map[waitKey]*waitGroup
	leading map[waitKey]*leadingTry
}{groups: map[waitKey]*waitGroup{}, leading: map[waitKey]*leadingTry{}}

func waitable(r Result) bool {
	switch r.(type) {
	case *InProgress, *RetryLater:
		return true
	}
	return false
}

func held(r Result) bool {
	switch r.(type) {
	case *Claimed, *registered:
		return true
	}
	return false
}

// claimWaiting runs try, and while its answer is waitable waits up to wait
// for the key among the other requests waiting for it. id names what the
// try asks for: requests with one id can take each other's answers.
func claimWaiting(ctx context.Context, db *sql.DB, id string, wait time.Duration, try tryFunc) (tryResult, error) {
	if wait <= 0 {
		return try(ctx)
	}
	deadline := time.Now().Add(wait)
	key := waitKey{db, id}
	waits.Lock()
	if g := waits.groups[key]; g != nil {
		m := g.join(deadline)
		waits.Unlock()
		return g.await(ctx, m)
	}
	var first tryResult
	if lead := waits.leading[key]; lead != nil {
		waits.Unlock()
		<-lead.done
		if lead.err != nil {
			return claimWaiting(ctx, db, id, time.Until(deadline), try)
		}
		first = lead.r
		if held(first.res) { // the leader's own: for the others, the key is in progress
			first = tryResult{res: &InProgress{}}
		}
	} else {
		lead := &leadingTry{done: make(chan struct{})}
		waits.leading[key] = lead
		waits.Unlock()
		lead.r, lead.err = try(ctx)
		waits.Lock()
		delete(waits.leading, key)
		waits.Unlock()
		close(lead.done)
		first = lead.r
		if lead.err != nil {
			return tryResult{}, lead.err
		}
	}
	if !waitable(first.res) || ctx.Err() != nil {
		return first, nil
	}
	waits.Lock()
	g := waits.groups[key]
	fresh := g == nil
	if fresh {
		g = &waitGroup{key: key, try: try, last: first.res}
		waits.groups[key] = g
	}
	m := g.join(deadline)
	waits.Unlock()
	if fresh {
		go g.poll()
	}
	return g.await(ctx, m)
}

// join adds a waiter; the caller holds waits' lock.
func (g *waitGroup) join(deadline time.Time) *waiter {
	m := &waiter{deadline: deadline, answer: make(chan waitAnswer, 1)}
	g.members = append(g.members, m)
	return m
}

// await is one request's wait: an answer from the poller, or its deadline
// or its context, whichever comes first.
func (g *waitGroup) await(ctx context.Context, m *waiter) (tryResult, error) {
	timer := time.NewTimer(time.Until(m.deadline))
	defer timer.Stop()
	var a waitAnswer
	select {
	case a = <-m.answer:
	case <-timer.C:
	case <-ctx.Done():
	}
	if a.r.res == nil && a.err == nil {
		waits.Lock()
		left := g.remove(m)
		last, lastErr := g.last, g.lastErr
		waits.Unlock()
		if left && lastErr != nil {
			return tryResult{}, lastErr
		}
		if left {
			return tryResult{res: last}, nil
		}
		a = <-m.answer // the poller answered as the request was leaving
	}
	// A claim for a request that has gone: the key goes back at once.
	if held(a.r.res) && ctx.Err() != nil {
		a.r.abandon()
		return tryResult{res: &InProgress{}}, nil
	}
	return a.r, a.err
}

// remove takes m out of the group; false if the poller already answered
// it. The caller holds waits' lock.
func (g *waitGroup) remove(m *waiter) bool {
	for i, other := range g.members {
		if other == m {
			g.members = append(g.members[:i], g.members[i+1:]...)
			return true
		}
	}
	return false
}

// poll is the group's poller; it ends when nobody waits any more or the key
// is settled. Its tries run on a context of their own: a transaction it
// begins outlives the try (it is handed to a waiting request).
func (g *waitGroup) poll() {
	delay := firstPoll
	for {
		waits.Lock()
		if len(g.members) == 0 {
			delete(waits.groups, g.key)
			waits.Unlock()
			return
		}
		latest := g.members[0].deadline
		for _, m := range g.members {
			if m.deadline.After(latest) {
				latest = m.deadline
			}
		}
		waits.Unlock()
		sleep := time.Until(latest)
		if sleep > delay {
			sleep = delay
		}
		time.Sleep(sleep)
		if delay *= 2; delay > maxPoll {
			delay = maxPoll
		}
		waits.Lock()
		nobody := len(g.members) == 0
		waits.Unlock()
		if nobody {
			continue // removed at the top of the loop
		}
		r, err := g.try(context.Background())
		waits.Lock()
		g.lastErr = err
		switch {
		case err != nil: // waits on for the next try
		case waitable(r.res):
			g.last = r.res
		case held(r.res) && len(g.members) > 0:
			m := g.members[0]
			g.members = g.members[1:]
			m.answer <- waitAnswer{r: r}
		case held(r.res):
			waits.Unlock()
			r.abandon()
			continue
		default: // settled: every waiter hears of it
			for _, m := range g.members {
				m.answer <- waitAnswer{r: r}
			}
			g.members = nil
			delete(waits.groups, g.key)
			waits.Unlock()
			return
		}
		waits.Unlock()
	}
}
