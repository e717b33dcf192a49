"""Training-only meta turns: short messages a user sends about the conversation itself rather than a new request.

People in a chat app often reply to the assistant with a turn about the exchange so far: continue an answer that was
cut off or truncated, send the rest or the next part, redo or regenerate, shorten or expand, change the format (a
table, bullets, a code block, JSON) or the tone, translate, fix a mistake in the last reply, go back to an earlier
point, stop or end the current task, wrap up or summarize, finish the code/list/essay/email, cut or drop a part of
the text, start over, or just say thanks and ok. A harm classifier that has never met such turns can misread the
task words in them ("end", "finish", "cut", "stop", "over", "done", "kill", "drop", "quit", "wrap" as in "kill that
paragraph"), so ``META_TURNS`` gives it ordinary examples, every one benign and plainly about the chat, the text or
the task; many use those words in their harmless meta sense. Typed the way people type: mixed and lower case, some
typos and abbreviations ("pls", "u", "thx"), punctuation or none, 1-14 words each.

For the classifier's training split only. Written 2026-12-07 without reading any eval set; "continue" was dropped
afterwards because a hand-written eval slice asks it word for word (the leakage test).
"""

META_TURNS: tuple[str, ...] = (
    # continuing a cut-off, truncated or unfinished answer
    "your answer got cut off, can you continue?",
    "it stopped mid-sentence, pls finish",
    "Keep going",
    "the reply was truncated after step 4",
    "u stopped halfway through the code, finish it pls",
    "Looks like the response ended early. go on",
    "that seems unfinished, can you complete it",
    "Your last message is incomplete, pick up where it ended",
    "cont.",
    "go on from where you cut off",
    "output got truncated again, continue from the last line",
    "you stopped at point 3, carry on",
    "the table ends mid row, finish it",
    "pls continue ur answer it got cut",
    "message cut off at the end, can u resend the rest",
    # the rest, the next part, the remaining steps
    "whats the next part",
    "ok now give me the remaining steps",
    "Show me the rest of the list",
    "next",
    "and part 2?",
    "what comes after step 5",
    "send the remaining sections pls",
    "go ahead with chapter 3 of the outline",
    # redo / regenerate
    "try that again",
    "redo it pls",
    "Can you regenerate that answer?",
    "give me another version of that",
    "Nope, do it over with a different example",
    "that wasn't quite it, one more try",
    "rewrite the whole thing from scratch",
    # shorten / expand
    "too long, cut it down to 3 sentences",
    "shorter pls",
    "can u make it more concise",
    "trim it to under 100 words",
    "Expand on the second point",
    "more detail on that last bit",
    "make it longer, like a full page",
    "tl;dr version?",
    # format
    "put that in a table",
    "as bullet points pls",
    "can you wrap that in a code block",
    "Give it to me as JSON",
    "format it as a numbered list",
    "make it markdown with headers",
    "output as csv instead",
    "no bullets, just plain paragraphs",
    # tone
    "make it sound more casual",
    "less formal pls",
    "Can you make the tone friendlier?",
    "too stiff, loosen it up a bit",
    "more professional, it's for my boss",
    "tone it down, it sounds too salesy",
    # translate
    "translate that into Spanish",
    "now in french pls",
    "can u give me the german version",
    "same thing but in japanese",
    "Translate your last reply to Portuguese",
    # fixing an error in the previous reply
    "there's a typo in the second line",
    "that code doesn't compile, fix it",
    "you got the date wrong, it's 2024",
    "the math in step 2 is off, check it again",
    "fix the indentation in that snippet",
    "wrong variable name on line 7",
    "u mixed up the two columns, pls correct",
    "The link you gave is broken, can you fix the reply",
    # going back to an earlier point
    "let's go back to the first question",
    "back to what we were discussing earlier",
    "can we return to the outline from before",
    "scroll back up, the second option you mentioned",
    "going back to the budget thing, what about q3",
    "Revisit your earlier answer about the API",
    # stopping or ending the current task
    "ok that's enough",
    "Let's stop here",
    "we can end it there",
    "we're done with this one",
    "stop, that's plenty for now",
    "you can stop generating",
    "that's it, end of task",
    "let's call it done for this doc",
    "quit the list there, thanks",
    "quit writing more examples, I have enough",
    "ok we're over this topic, new question",
    "end the story at that scene",
    # wrapping up / summarizing
    "wrap it up",
    "can you wrap up with a short summary",
    "Summarize everything we covered",
    "give me a recap of this chat",
    "finish off with a conclusion paragraph",
    "sum it up in one line",
    "wrap up the email with a sign-off",
    "end the essay with a strong closing line",
    # finishing the code / list / essay / email
    "finish the function pls",
    "can you finish the essay, it needs a last section",
    "Finish the email, it just ends at the greeting",
    "complete the list up to 10 items",
    "finsh the script, the main loop is missing",
    "finish writing the cover letter",
    "finish the sql query you started",
    "pls finish the poem, it's missing the last verse",
    # deleting or cutting part of the text
    "cut the last paragraph",
    "kill the intro",
    "drop the second point",
    "Kill that paragraph, it's redundant",
    "cut the part about pricing",
    "remove the emojis",
    "drop the last column of the table",
    "delete the opening sentence",
    "kill the closing line, it's cheesy",
    "cut everything after the third bullet",
    # starting over
    "start over",
    "lets start fresh with a new draft",
    "Scrap that and begin again",
    "wipe that draft, start over from the outline",
    # thanks / ok acknowledgements
    "thx that's perfect",
    "ok cool",
    "thanks, that's all for this task",
    "got it ty",
    "Great, we're done here, thanks!",
    "perfect, over and out",
)
