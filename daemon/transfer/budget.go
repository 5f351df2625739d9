package transfer

import (
	"context"
	"time"
)

type budgetKey struct{}

// WithBudget returns ctx carrying how long a Pull, or each run of a PullMany, may take
// once it holds one of its peer's slots (Options.MaxPullsPerPeer): the wait for the
// slot is bounded by ctx alone. The slots are shared with the owner's other pulls from
// that peer, so a budget counted from before the wait failed a small get queued behind
// large pulls that were moving at the budget's own rate (a review).
func WithBudget(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, budgetKey{}, d)
}

// budgeted is ctx bounded by its budget (WithBudget) from now; ctx itself without one.
func budgeted(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Value(budgetKey{}).(time.Duration); ok && d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return ctx, func() {}
}
