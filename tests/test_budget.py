"""infer.serve.budget.Budget: the gRPC messages' bytes, taken first come, first served."""
import asyncio

from infer.serve.budget import Budget


def run(coro):
    return asyncio.run(coro)


def test_takers_wait_in_order_and_a_small_one_does_not_overtake():
    async def main():
        b, order = Budget(10), []

        async def taker(name, n):
            await b.take(n)
            order.append(name)

        await b.take(7)
        big, small = asyncio.create_task(taker("big", 6)), asyncio.create_task(taker("small", 2))
        await asyncio.sleep(0)
        assert order == [] and b.held == 7  # 2 would fit, but it waits behind 6
        b.give(5)  # 2 held: 6 fits, then 2 does too
        await asyncio.gather(big, small)
        return order, b.held

    assert run(main()) == (["big", "small"], 10)


def test_a_cancelled_waiter_holds_nothing_and_lets_the_next_go():
    async def main():
        b = Budget(10)
        await b.take(9)
        first = asyncio.create_task(b.take(5))
        second = asyncio.create_task(b.take(1))
        await asyncio.sleep(0)
        assert b.held == 9
        first.cancel()
        await asyncio.sleep(0)
        await asyncio.wait_for(second, 1)  # 9 + 1 fits once the 5 ahead of it is gone
        held = b.held
        b.give(9)
        b.give(1)
        return held, b.held, first.cancelled()

    assert run(main()) == (10, 0, True)


def test_one_granted_and_cancelled_before_it_ran_gives_its_bytes_back():
    async def main():
        b = Budget(10)
        await b.take(10)
        waiter = asyncio.create_task(b.take(4))
        await asyncio.sleep(0)
        b.give(10)  # grants the waiter (held 4) ...
        waiter.cancel()  # ... which is cancelled before it runs
        await asyncio.gather(waiter, return_exceptions=True)
        return b.held

    assert run(main()) == 0


def test_timed_out_takers_under_asyncio_timeout_leave_the_budget_whole():
    async def main():
        b = Budget(8)
        await b.take(8)

        async def bounded():
            try:
                async with asyncio.timeout(0.01):
                    await b.take(8)
                return "got"
            except TimeoutError:
                return "timed out"

        results = await asyncio.gather(*(bounded() for _ in range(5)))
        b.give(8)
        return results, b.held

    assert run(main()) == (["timed out"] * 5, 0)
