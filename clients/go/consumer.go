package idempotency

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"sync"
	"time"
)

// Handler handles one delivered event; its error decides the settlement
// (see Settle). ctx ends only StopTimeout after the consumer was asked to
// stop, so that an event in hand can finish.
type Handler func(ctx context.Context, d Delivery) error

// ConsumeOptions: all optional.
type ConsumeOptions struct {
	Name         string        // the relay name recorded on the events ("go-consumer-PID"); the slot number is appended
	Concurrency  int           // slots claiming and handling at once: 1
	Batch        int           // events each slot claims at a time: 1 (at most 10,000)
	Lease        time.Duration // how long a claimed event is the slot's: 60 s (at most idempotency.max_lease)
	PollInterval time.Duration // how long an idle slot waits before claiming again: 1 s
	// Wake, when given, ends an idle wait at once (feed it from a LISTEN on
	// idempotency_outbox with your driver; database/sql has no LISTEN).
	Wake        <-chan struct{}
	StopTimeout time.Duration // how long events in hand get once ctx ends: 10 s
	OnError     func(error)   // claims, acks and nacks that failed (the events come back when their lease ends)
}

func (o *ConsumeOptions) normalized() ConsumeOptions {
	var n ConsumeOptions
	if o != nil {
		n = *o
	}
	if n.Name == "" {
		n.Name = fmt.Sprintf("go-consumer-%d", os.Getpid())
	}
	if n.Concurrency == 0 {
		n.Concurrency = 1
	}
	if n.Batch == 0 {
		n.Batch = 1
	}
	if n.Lease == 0 {
		n.Lease = 60 * time.Second
	}
	if n.PollInterval == 0 {
		n.PollInterval = time.Second
	}
	if n.StopTimeout == 0 {
		n.StopTimeout = 10 * time.Second
	}
	if n.OnError == nil {
		n.OnError = func(err error) { log.Printf("idempotency consumer %s: %v", n.Name, err) }
	}
	return n
}

// check: values that would fail every claim whatever the server's
// settings are Consume's error at once, rather than claims made in vain.
func (o *ConsumeOptions) check() error {
	if o.Concurrency < 0 {
		return fmt.Errorf("idempotency: ConsumeOptions.Concurrency must not be negative, not %d", o.Concurrency)
	}
	if o.Batch < 1 || o.Batch > maxBatch {
		return fmt.Errorf("idempotency: ConsumeOptions.Batch must be from 1 to %d, not %d", maxBatch, o.Batch)
	}
	return firstError(checkLease("ConsumeOptions.Lease", o.Lease),
		checkNotNegative("ConsumeOptions.PollInterval", o.PollInterval),
		checkNotNegative("ConsumeOptions.StopTimeout", o.StopTimeout))
}

// Consume claims events of topics (all the role may claim when empty) and
// runs handler for each, then acks or nacks it (Settle). Events of one
// (topic, key) come one at a time, in order: the outbox hands out a key's
// next event only once the previous one is settled. It returns once ctx
// has ended and the events in hand are settled (a graceful stop); events
// claimed but not started go back at once (outbox_release). It returns an
// error at once for options out of range, and stops as on ctx's end when
// outbox_claim refuses its options (22023: a Lease over the server's
// idempotency.max_lease), which it would do at every claim.
func Consume(ctx context.Context, db *sql.DB, topics []string, handler Handler, opts *ConsumeOptions) error {
	o := opts.normalized()
	if err := o.check(); err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	refused := make(chan error, 1)
	topicsParam, err := jsonParam(topics)
	if err != nil {
		return err
	}
	if len(topics) == 0 {
		topicsParam = nil
	}
	work, cancelWork := context.WithCancel(context.Background())
	defer cancelWork()
	stopped := make(chan struct{})
	go func() { // handlers get StopTimeout past ctx
		select {
		case <-ctx.Done():
		case <-stopped:
			return
		}
		select {
		case <-time.After(o.StopTimeout):
			cancelWork()
		case <-stopped:
		}
	}()
	var slots sync.WaitGroup
	for i := 0; i < o.Concurrency; i++ {
		slots.Add(1)
		s := slot{db: db, relay: fmt.Sprintf("%s/%d", o.Name, i), topics: topicsParam, handler: handler, o: o,
			refused: func(err error) {
				select {
				case refused <- err:
				default: // another slot's refusal says the same
				}
				stop()
			}}
		go func() {
			defer slots.Done()
			s.loop(ctx, work)
		}()
	}
	slots.Wait()
	close(stopped)
	select {
	case err := <-refused:
		return err
	default:
		return nil
	}
}

type slot struct {
	db      *sql.DB
	relay   string
	topics  any
	handler Handler
	o       ConsumeOptions
	refused func(error) // the claim's arguments were refused: stop consuming
}

func (s slot) loop(ctx, work context.Context) {
	for ctx.Err() == nil {
		batch, err := claimDeliveries(ctx, s.db, s.relay, s.o.Batch, s.o, s.topics)
		if SQLState(err) == "22023" {
			s.refused(fmt.Errorf("idempotency: outbox_claim refused the consumer's claim (Batch %d, Lease %v): %w",
				s.o.Batch, s.o.Lease, err))
			return
		}
		if err != nil && ctx.Err() == nil {
			s.o.OnError(err)
		}
		if len(batch) == 0 {
			s.idle(ctx)
			continue
		}
		for i, d := range batch {
			if ctx.Err() != nil {
				s.release(batch[i:])
				return
			}
			s.settle(ctx, d, s.run(work, d))
		}
	}
}

// run calls the handler; a panic is the event's error, not the process's end.
func (s slot) run(ctx context.Context, d Delivery) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the handler panicked: %v", p)
			s.o.OnError(err)
		}
	}()
	return s.handler(ctx, d)
}

func (s slot) settle(stop context.Context, d Delivery, handlerErr error) {
	st := Settle(handlerErr)
	if st.Action == "release" {
		s.holdBeforeRelease(stop, *st.RetryIn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	switch st.Action {
	case "ack":
		_, err = s.db.ExecContext(ctx, sqlOutboxAck, d.ID)
	case "nack":
		var retryIn any
		if st.RetryIn != nil {
			retryIn = st.RetryIn.Seconds()
		}
		_, err = s.db.ExecContext(ctx, sqlOutboxNack, d.ID, st.Error, st.Retryable, retryIn)
	case "release":
		_, err = s.db.ExecContext(ctx, sqlOutboxRelease, d.ID, s.relay)
	}
	if err != nil {
		s.o.OnError(fmt.Errorf("settling event %d: %w", d.ID, wrap(err)))
	}
}

// holdBeforeRelease keeps an event whose key another worker holds for
// retryAfter, at least PollInterval (so that a slot does not claim it again
// at once, over and over) and at most half the lease (released, its attempt
// is not counted; expired, it would be); a stop ends the wait.
func (s slot) holdBeforeRelease(stop context.Context, retryAfter time.Duration) {
	wait := retryAfter
	if wait < s.o.PollInterval {
		wait = s.o.PollInterval
	}
	if wait > s.o.Lease/2 {
		wait = s.o.Lease / 2
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-stop.Done():
	case <-timer.C:
	}
}

func (s slot) release(rest []Delivery) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, d := range rest {
		if _, err := s.db.ExecContext(ctx, sqlOutboxRelease, d.ID, s.relay); err != nil {
			s.o.OnError(fmt.Errorf("releasing event %d: %w", d.ID, wrap(err)))
		}
	}
}

func (s slot) idle(ctx context.Context) {
	timer := time.NewTimer(s.o.PollInterval)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	case <-s.o.Wake:
	}
}
